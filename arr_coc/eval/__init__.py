"""
The evaluation side of ARR-COC: the synthetic scenes and the JSONL dataset format (data), the fine-print pages
(fineprint), the evaluation sets evaluate reads (sets: DocVQA, TextVQA, ChartQA, JSONL, synthetic), the answer
metrics (metrics), the faithfulness curves over the saccades (faithfulness) and evaluate's report (report).
The commands that use them (run, train, evaluate, bench) stay at arr_coc/ top level.

    python -m arr_coc.eval.data --out data/synth --n 200        # a synthetic JSONL dataset (or: arr-coc-data)
"""
