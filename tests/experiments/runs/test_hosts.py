"""experiments.runs.hosts: the machine is recorded in the fingerprint and in every cell, never in
the code hash, and a run folder resuming another machine's cells says so in one line."""

import json

from experiments import runs
from experiments.runs import hosts

ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
cpu family\t: 25
model\t\t: 17
model name\t: AMD EPYC
stepping\t: 1
flags\t\t: fpu sse2 avx2 avx512f fma

processor\t: 1
model name\t: something else
"""


def test_the_host_is_named_by_its_cpu_and_flags(tmp_path):
    a, b, c = (tmp_path / n for n in ("a", "b", "c"))
    a.write_text(ZEN4)
    b.write_text(ZEN4.replace(" avx512f", ""))  # the same model, fewer extensions
    c.write_text(ZEN4.replace("fpu sse2 avx2 avx512f fma", "fma avx512f avx2 sse2 fpu"))
    fa, fb, fc = (hosts.host_fingerprint(p) for p in (a, b, c))
    assert fa["cpu"] == "model name AMD EPYC, cpu family 25, model 17, stepping 1"
    assert fa["id"] != fb["id"] and fa["id"] == fc["id"]  # flags count, not their order
    missing = hosts.host_fingerprint(tmp_path / "none")
    assert missing["cpu"] and len(missing["id"]) == 12


def test_the_code_hash_ignores_the_host_and_cells_record_it(tmp_path, capsys):
    fp = runs.code_fingerprint()
    assert fp["host"] == hosts.host_fingerprint()
    other = {**fp, "host": {**fp["host"], "id": "0123456789ab", "cpu": "elsewhere"}}
    assert runs.code_hash(other) == runs.code_hash(fp)
    folder = runs.RunFolder("demo", {"lr": 0.1}, out=tmp_path / "r", code=other)
    folder.record({"seed": 0}, {"acc": 0.5})
    folder.record({"seed": 1}, {"acc": 0.6})
    cells = [json.loads(p.read_text()) for p in sorted((tmp_path / "r" / "cells").iterdir())]
    assert [c["host"] for c in cells] == ["0123456789ab"] * 2
    capsys.readouterr()
    here = runs.RunFolder("demo", {"lr": 0.1}, out=tmp_path / "r", code=fp)  # resumes: same hash
    assert here.done({"seed": 0}) == {"seed": 0, "acc": 0.5}
    err = capsys.readouterr().err
    assert "[demo] 2 of 2 finished cells that record their machine were computed on another" in err
    here.record({"seed": 2}, {"acc": 0.7})
    runs.RunFolder("demo", {"lr": 0.1}, out=tmp_path / "r", code=other)
    assert "1 of 3 finished cells" in capsys.readouterr().err
    runs.RunFolder("demo", {"lr": 0.1}, out=tmp_path / "fresh", code=fp)
    assert capsys.readouterr().err == ""
