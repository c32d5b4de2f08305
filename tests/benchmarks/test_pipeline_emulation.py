"""benchmarks/pipeline_emulation.py on a GPT (issue 23): token windows, the language-model
AdamW on both sides, a row per policy with its ratio to the synchronous step, tokens per second
and its compile time."""

import pytest

from benchmarks import pipeline_emulation


@pytest.mark.slow  # ~40 s: five GPT programs compiled and timed
def test_a_gpt_pipeline_round_is_timed_against_the_synchronous_step():
    argv = "--model gpt-tiny --stages 2 --batch 2 --reps 1 --rounds 1 --policies sync,stash,2bw"
    argv += " --context 32 --precision bfloat16"
    table = pipeline_emulation.main(argv.split())
    head = "gpt-tiny (31,891 params), context 32, vocabulary 83, bfloat16, batch 2, adamw, N=2"
    assert head in table
    assert "| policy | ms / step | tokens / s | MFU | vs sync step | vs sync step, same" in table
    rows = {line.split(" | ")[0].strip("| "): line for line in table.splitlines()[4:]}
    micro = "plain sync step, 2 micro-batches accumulated"  # 2BW's M at N = 2
    two_bw = "2bw (looped: 2 chunks)"
    assert set(rows) == {"plain sync step (unsplit)", micro, "sync", "stash", two_bw}
    for p in ("sync", "stash", two_bw):
        cells = rows[p].strip("|").split("|")
        assert cells[4].strip().endswith("x") and float(cells[-1]) > 0  # ratio, compile seconds
        assert cells[3].strip() == "–"  # no MFU on a CPU (its peak is not in the table)
    # 2BW splits the mini-batch: its second ratio is to the unsplit step over its micro-batches
    assert rows[two_bw].strip("|").split("|")[5].strip().endswith("x")
    assert rows["stash"].strip("|").split("|")[5].strip() == "–"
