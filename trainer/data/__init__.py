"""Data: text in, fixed-length token rows out, and the one seeded sample order every split shares.

Owns `fleet prepare` (sources, packer, shard writer, progress bar), the dataset folder's format,
the tokenizers (bytes, `tokenizer.json`, the BPE trained by `--train-tokenizer`) and the reading
side (`dataset.py`: the global order, train and val batches).
May import: numpy, pyarrow, the tokenizers extra and `telemetry`'s core; never mlx (preparing
data needs no accelerator, and a data-only host need not install one).
"""
