"""
pocket-qwen2-vl's training: the offline model (models/pocket-qwen2-vl) is a stock Qwen2-VL at a pocket size, trained
here from scratch on the synthetic fine-print suite (arr_coc.synth.fineprint).

    model.py     the architecture (stock Qwen2VLConfig at a pocket size), its tokenizer, the batched ViT attention
    data.py      the curriculum, each batch's pages and conversations, their ids, labels, positions and targets
    heldout.py   the held-out check: the suite on new seeds, teacher-forced exact match
    train.py     the training loop (one process or torchrun), resumable state in small shards, export
    reading.py   the training-only reading head: every visual token names the characters its cell holds
    binding.py   the training-only binding head: what colour, shape, box and field each cell belongs to
    pointing.py  the training-only pointing loss: where an answer's attention must look (its target's tokens)

    torchrun --nproc-per-node 4 -m arr_coc.pocket.train --out runs/pocket --minutes 18 --resume

Loading the exported model needs none of this (arr_coc.checkpoints names its folder; stock transformers loads it).
"""
