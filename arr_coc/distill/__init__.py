"""
Self-distillation (issue #52): a teacher that says where the frozen VLM itself looks when it reads the whole image
and gives its answer (teacher.py), and a cache of its maps on disk that training reads (cache.py).

    python -m arr_coc.commands.teacher --model models/pocket-qwen2-vl --pages 48 --out out/teacher
"""
