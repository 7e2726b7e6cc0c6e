"""The training harness: Hydra apps (train, study), benchmarks, throughput, reliability."""
