"""The model: the nanochat GPT, its architecture as numbers, the KV cache, the loss head,
generation outside the model, a checkpoint as a model (`trained.py`) and `fleet export`.

May import: mlx and `trainer.data` (tokenizers) and `trainer.checkpoint`; `config.py` imports
nothing, so planning code can size a model without mlx. Never the loop or the launcher.
"""
