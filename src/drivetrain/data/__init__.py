"""nuScenes-format data: synthetic generator, frame index, dataset, sequence sampler, collate, evaluation."""
