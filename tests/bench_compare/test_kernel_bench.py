"""``python -m bench_compare.kernel_bench``: a bad flag is a one-line error and exit 2, before anything is timed."""

from __future__ import annotations

import pytest

from bench_compare import kernel_bench


@pytest.mark.parametrize(("argv", "message"), [
    (["--models", "no-such-model"], "--models: unknown model name 'no-such-model'; known models: smollm2-135m"),
    (["--repeat", "0"], "--repeat must be at least 1"),
    (["--threads", "0"], "--threads must be 1.."),
    (["--cpu-time"], "--cpu-time needs --threads 1"),
])
def test_bad_flags_exit_2_with_the_reason(argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        kernel_bench.main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
