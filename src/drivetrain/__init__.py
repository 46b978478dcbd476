"""drivetrain: fast, faithful training of autonomous-driving 3D perception models."""

__version__ = "0.1.0"
