"""Scene layouts of the synthetic generator: a straight road, the ego vehicle and moving objects.

Every scene is a straight road in its own *local* frame (x along the road, y to the left, z up), placed
in the global frame by a random origin and heading. The ego vehicle drives along y = 0 at constant
speed. Vehicles drive in four lanes (y = ±3.5, ±7; one speed per lane, so no two collide), cones,
barriers and parked two-wheelers stand on the shoulders (|y| ≈ 9.5), pedestrians walk on the
sidewalks (|y| ∈ [10.5, 13.5], one speed per sidewalk). Sizes are jittered class priors (nuScenes-like
means). Motion is linear, so velocities from annotation differences (the devkit's ``box_velocity``)
are exact. Near the ego start every class appears at least once, so short scenes still cover all ten.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from drivetrain.data.formats.nuscenes.tables import CLASSES

__all__ = ["CLASS_SIZE", "ObjectTrack", "SceneLayout", "make_layout"]

# Mean (length dx, width dy, height dz) in metres per class.
CLASS_SIZE = {
    "car": (4.6, 1.95, 1.7),
    "truck": (6.5, 2.5, 2.8),
    "construction_vehicle": (6.4, 2.8, 3.2),
    "bus": (11.0, 2.9, 3.5),
    "trailer": (12.0, 2.9, 3.9),
    "barrier": (0.5, 2.5, 1.0),
    "motorcycle": (2.1, 0.8, 1.5),
    "bicycle": (1.7, 0.6, 1.3),
    "pedestrian": (0.7, 0.7, 1.75),
    "traffic_cone": (0.4, 0.4, 1.1),
}
LANE_CLASSES = ("car", "truck", "construction_vehicle", "bus", "trailer", "motorcycle", "bicycle")
LANE_WEIGHTS = np.array([0.6, 0.12, 0.04, 0.06, 0.04, 0.07, 0.07])
LANES = (-7.0, -3.5, 3.5, 7.0)


@dataclass(frozen=True)
class ObjectTrack:
    """One object moving linearly in the scene's local frame."""

    label: int  # index into CLASSES
    size: tuple[float, float, float]  # (dx, dy, dz) metres
    start: tuple[float, float]  # local (x, y) at scene time 0
    yaw: float  # local heading
    velocity: tuple[float, float]  # local (vx, vy) m/s
    attribute: str  # nuScenes attribute name, "" for classes without attributes

    @property
    def name(self) -> str:
        """The detection class name of ``label``."""
        return CLASSES[self.label]


@dataclass(frozen=True)
class SceneLayout:
    """A straight road scene: where it lies in the global frame, the ego speed and the object tracks."""

    origin: tuple[float, float]  # global (x, y) of the local origin
    heading: float  # global yaw of the local x axis
    ego_speed: float  # m/s along local +x
    objects: tuple[ObjectTrack, ...]

    def local_to_global(self, xy: np.ndarray) -> np.ndarray:
        """``(..., 2)`` local → global xy."""
        c, s = np.cos(self.heading), np.sin(self.heading)
        return xy @ np.array([[c, s], [-s, c]]) + np.asarray(self.origin)

    def ego_xy(self, t: float) -> np.ndarray:
        """Global ``(2,)`` ego position at scene time ``t`` seconds."""
        return self.local_to_global(np.array([self.ego_speed * t, 0.0]))

    def boxes(self, t: float) -> np.ndarray:
        """Global boxes ``(M, 9)`` ``(x, y, z_centre, dx, dy, dz, yaw, vx, vy)`` at time ``t``."""
        out = np.zeros((len(self.objects), 9))
        c, s = np.cos(self.heading), np.sin(self.heading)
        for i, o in enumerate(self.objects):
            local = np.array(o.start) + t * np.array(o.velocity)
            out[i, :2] = self.local_to_global(local)
            out[i, 2] = o.size[2] / 2
            out[i, 3:6] = o.size
            out[i, 6] = _wrap(o.yaw + self.heading)
            out[i, 7:9] = (c * o.velocity[0] - s * o.velocity[1], s * o.velocity[0] + c * o.velocity[1])
        return out


def _wrap(angle: float) -> float:
    return float((angle + np.pi) % (2 * np.pi) - np.pi)


def _size(rng: np.random.Generator, name: str) -> tuple[float, float, float]:
    mean = np.array(CLASS_SIZE[name])
    return tuple(float(v) for v in mean * rng.uniform(0.9, 1.1, 3))  # type: ignore[return-value]


def _vehicle_attribute(name: str, speed: float, rng: np.random.Generator) -> str:
    if name in ("motorcycle", "bicycle"):
        return "cycle.with_rider" if speed > 0 else "cycle.without_rider"
    if speed > 0:
        return "vehicle.moving"
    return "vehicle.stopped" if rng.random() < 0.5 else "vehicle.parked"


def make_layout(rng: np.random.Generator, duration: float, reach: float) -> SceneLayout:
    """A random scene lasting ``duration`` seconds; objects come within ``reach`` metres of the ego."""
    ego_speed = float(rng.uniform(2.0, 8.0))
    objects: list[ObjectTrack] = []
    label = {n: i for i, n in enumerate(CLASSES)}

    def span(speed_x: float) -> tuple[float, float]:
        # start positions whose relative track [x0, x0 + (v - v_ego)·T] meets [-reach, reach]
        rel = (speed_x - ego_speed) * duration
        return -reach - max(rel, 0.0), reach - min(rel, 0.0)

    forced = list(LANE_CLASSES)
    rng.shuffle(forced)
    for lane_i, y in enumerate(LANES):
        direction = 1.0 if y < 0 else -1.0
        speed = 0.0 if rng.random() < 0.25 else float(rng.uniform(3.0, 12.0))
        lo, hi = span(direction * speed)
        start = float(rng.uniform(-8.0, 8.0))
        for side in (1.0, -1.0):
            # Outwards from ``start``; the lane's share of the forced classes come first (near the ego).
            queue = forced[lane_i :: len(LANES)] if side > 0 else []
            x = start if side > 0 else start - float(rng.uniform(4.0, 18.0))
            while lo <= x <= hi:
                name = queue.pop(0) if queue else str(rng.choice(LANE_CLASSES, p=LANE_WEIGHTS))
                size = _size(rng, name)
                centre = x + side * size[0] / 2
                objects.append(_lane_object(rng, label[name], name, centre, y, direction, speed, size))
                x += side * (size[0] + float(rng.uniform(4.0, 18.0)))
    for side in (1.0, -1.0):  # shoulders: cone clusters, barriers, parked two-wheelers
        y = side * 9.5
        _, hi = span(0.0)
        x = float(rng.uniform(-12.0, 4.0))
        first: str | None = "traffic_cone" if side > 0 else "barrier"  # near the ego start on every scene
        while x <= hi:
            kind = first or str(
                rng.choice(["traffic_cone", "barrier", "bicycle", "motorcycle"], p=[0.45, 0.35, 0.1, 0.1])
            )
            first = None
            count = int(rng.integers(2, 5)) if kind in ("traffic_cone", "barrier") else 1
            for _ in range(count):
                size = _size(rng, kind)
                yaw = np.pi / 2 if kind == "barrier" else float(rng.uniform(-0.3, 0.3))
                attr = "cycle.without_rider" if kind in ("bicycle", "motorcycle") else ""
                objects.append(ObjectTrack(label[kind], size, (x, y), yaw, (0.0, 0.0), attr))
                x += max(size[0], size[1]) + float(rng.uniform(0.8, 2.5))
            x += float(rng.uniform(8.0, 30.0))
    for side in (1.0, -1.0):  # sidewalks: pedestrians, one speed per sidewalk
        direction = 1.0 if rng.random() < 0.5 else -1.0
        speed = 0.0 if rng.random() < 0.3 else float(rng.uniform(0.8, 1.6))
        _, hi = span(direction * speed)
        x = float(rng.uniform(-10.0, 6.0))
        while x <= hi:
            size = _size(rng, "pedestrian")
            y = side * float(rng.uniform(10.5, 13.5))
            yaw = (0.0 if direction > 0 else np.pi) + float(rng.uniform(-0.2, 0.2))
            attr = "pedestrian.moving" if speed > 0 else "pedestrian.standing"
            objects.append(ObjectTrack(label["pedestrian"], size, (x, y), yaw, (direction * speed, 0.0), attr))
            x += float(rng.uniform(1.2, 12.0))
    origin = tuple(float(v) for v in rng.uniform(200.0, 2000.0, 2))
    return SceneLayout(origin, float(rng.uniform(-np.pi, np.pi)), ego_speed, tuple(objects))  # type: ignore[arg-type]


def _lane_object(
    rng: np.random.Generator,
    label: int,
    name: str,
    x: float,
    y: float,
    direction: float,
    speed: float,
    size: tuple[float, float, float],
) -> ObjectTrack:
    yaw = (0.0 if direction > 0 else np.pi) + float(rng.uniform(-0.05, 0.05))
    y = y + float(rng.uniform(-0.2, 0.2))
    return ObjectTrack(label, size, (x, y), yaw, (direction * speed, 0.0), _vehicle_attribute(name, speed, rng))
