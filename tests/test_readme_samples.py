"""The README's first code sample (a KV-cache update network built into an engine) runs as
written, on the real TensorRT-RTX builder."""

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_cache_update_sample_builds_an_engine(capsys):
    sample = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)[0]
    assert "add_kv_cache_update" in sample and "build_engine" in sample
    scope: dict = {}
    exec(compile(sample, str(README), "exec"), scope)
    assert capsys.readouterr().out.startswith(
        "CacheAlias(input='past_key', output='present_key', shape=(-1, 8, 1024, 64), "
        "dtype='float16')"
    )
    assert len(scope["engine"].data) > 0
