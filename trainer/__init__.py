"""The data-parallel MLX trainer: data, model, optimizer, checkpoints and the training loop."""
