"""
The pocket model's trainer from the command line (the trainer itself is arr_coc.pocket.trainer): its flags
(PocketTrainConfig's fields), torchrun's processes, the run, the export. Run as the trainer's own name:

    torchrun --nproc-per-node 4 -m arr_coc.pocket.train --out runs/pocket --minutes 18 --resume   # 4 GPUs, resumable
    python -m arr_coc.pocket.train --out runs/pocket --minutes 8 --resume      # one GPU
    python -m arr_coc.pocket.train --out runs/pocket --export models/pocket-qwen2-vl --steps 0 --resume  # export
    python -m arr_coc.pocket.train --tokenizer-only --export models/pocket-qwen2-vl                        # tokenizer

(The trainer's docstring has every example.) Under torchrun
with no CUDA GPU (or --device cpu) it refuses in one line, exit 2: one process per GPU, or one alone. --resume
into a folder with no run yet says in one line what it starts from: --init's exported folder, by default the
shipped model.
"""

import os
import sys
from pathlib import Path

from arr_coc.checkpoints import POCKET_FOLDER
from arr_coc.flags import config_parser, parse_config
from arr_coc.pocket import trainer
from arr_coc.pocket.model import build_tokenizer
from arr_coc.pocket.trainer import PocketTrainConfig, export, train
from arr_coc.runtime import distributed


def main(argv=None):
    parser = config_parser(PocketTrainConfig, trainer.__doc__)
    cfg = parse_config(PocketTrainConfig, argv, parser)
    if cfg.steps == 0 and cfg.export and not (Path(cfg.out) / "state.json").is_file():
        parser.error(f"--steps 0 --export: {cfg.out} holds no run (state.json) to export")
    if cfg.tokenizer_only:
        build_tokenizer().save_pretrained(cfg.export or POCKET_FOLDER)
        return
    if distributed.world_size() > 1 and distributed.default_device(cfg.device) == "cpu":
        if os.environ.get("RANK", "0") != "0":  # rank 0 alone says why: one line, not one a process
            sys.exit(2)
        parser.error(f"torchrun started {distributed.world_size()} processes, and with no CUDA GPU (or --device "
                     f"cpu) they would all train on the CPU, each with {cfg.workers} page workers, contending for the "
                     "same cores: run one process instead, python -m arr_coc.pocket.train ...")
    cfg.eval_sizes = tuple(cfg.eval_sizes)
    process = distributed.start(cfg.device)
    if process.is_main and (line := trainer.resume_line(Path(cfg.out), cfg.resume, Path(cfg.init))):
        process.log(line)
    if cfg.steps > 0 or not (Path(cfg.out) / "state.json").is_file():
        state = train(cfg, cfg.resume, process)
        process.log(f"done: step {state['step']}, {state['gpu_seconds'] / 60:.1f} GPU-minutes in all")
    if cfg.export and process.is_main:
        print(f"exported to {export(Path(cfg.out), Path(cfg.export))}")
    distributed.finish(process)


if __name__ == "__main__":
    main()
