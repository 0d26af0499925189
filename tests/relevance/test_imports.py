"""The relevance layer stands alone: importing it loads no VLM code and none of the pipelines' settings."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_relevance_layer_imports_no_vlm_and_no_pipeline_config():
    code = ("import sys\nimport arr_coc.relevance.layer, arr_coc.relevance.prior\n"
            "print(sorted(m for m in sys.modules if m.startswith(('arr_coc.vlm', 'arr_coc.config', 'arr_coc.pipelines',"
            " 'arr_coc.model', 'transformers.models'))))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
