"""`run_main`, the entry point of every `python -m genrec.studies.<topic>.*` driver: bad input is a
one-line message and exit code 2 (as the genrec CLI), never a traceback; a returned int is the exit
code, a result dict exits 0."""

import subprocess
import sys

import pytest

from genrec.workloads.errors import UserInputError, run_main


def test_bad_input_is_a_message_and_exit_code_2(capsys):
    def main():
        raise UserInputError("--data /x: no dataset there; create it with `genrec data synth`")

    with pytest.raises(SystemExit) as done:
        run_main(main)
    assert done.value.code == 2
    assert (
        capsys.readouterr().err == "error: --data /x: no dataset there; create it with `genrec data synth`\n"
    )


@pytest.mark.parametrize("result, code", [({"rows": []}, 0), (None, 0), (0, 0), (3, 3)])
def test_an_int_result_is_the_exit_code_and_anything_else_exits_0(result, code):
    with pytest.raises(SystemExit) as done:
        run_main(lambda: result)
    assert done.value.code == code


def test_other_errors_still_raise():
    def main():
        raise KeyError("a bug, not bad input")

    with pytest.raises(KeyError):
        run_main(main)


def test_a_driver_run_as_a_module_reports_bad_input_without_a_traceback(tmp_path, synth_dir):
    cmd = [sys.executable, "-m", "genrec.studies.atspeed.atspeed_objectives", "--data", str(synth_dir)]
    cmd += ["--models-dir", str(tmp_path), "--target", str(tmp_path / "nope"), "--quiet"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("error: --target") and "no checkpoint there" in done.stderr
