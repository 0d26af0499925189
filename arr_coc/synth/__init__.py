"""
Synthetic pages with known answers, drawn from a seed: the fine-print suite (fineprint.py) that the pocket model is
trained and judged on. It draws with PIL alone and knows nothing of models.
"""
