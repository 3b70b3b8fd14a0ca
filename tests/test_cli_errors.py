"""Errors a user meets on the command line end with one line, ``pl-privfed: error: <what>``,
exit status 2 and no traceback (``--debug`` shows it); missing or damaged data and checkpoints
are named; refused settings are refused before training."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pl_privfed.cli import main

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = str(REPO / "configs/algorithms/dp_alpha_normec_digits.yaml")
ALGORITHMS = REPO / "configs/algorithms"
QUIET = ["--trainer.logger", "false", "--trainer.enable_progress_bar", "false"]


def fails(args, capsys, code=2):
    """Run ``pl-privfed <args>`` in-process: its exit status and its one stderr line."""
    with pytest.raises(SystemExit) as info:
        main(args)
    err = capsys.readouterr().err.splitlines()
    assert info.value.code == code, err
    assert len(err) == 1, err
    assert err[0].startswith("pl-privfed: error: ")
    return err[0].removeprefix("pl-privfed: error: ")


# today each of these ended in 58-110 lines of chained jsonargparse tracebacks
CONFIG_ERRORS = [
    (
        [ALGORITHMS / "clip21.yaml", "--model.algorithm.init_args.clip_threshold", "0"],
        ["Clip21", "clip_threshold", "0.0", "positive"],
    ),
    (
        [
            ALGORITHMS / "dp_fedavg_per_sample_clipping.yaml",
            "--model.algorithm.init_args.clip_threshold",
            "-1",
        ],
        ["FedAvgPerSampleClipping", "clip_threshold", "-1.0", "positive"],
    ),
    (
        [
            ALGORITHMS / "ef21.yaml",
            "--model.algorithm.init_args.compressor",
            '{"class_path": "pl_privfed.operators.TopK", "init_args": {"k": 0, "ratio": null}}',
        ],
        ["TopK", "k must be an integer >= 1, got 0"],
    ),
    (
        [ALGORITHMS / "ef21.yaml", "--model.algorithm.init_args.compressor.init_args.ratio", "x"],
        ["model.algorithm.compressor.ratio (pl_privfed.operators.TopK)", "float", "(given: x)"],
    ),
    (
        [QUICKSTART, "--model.algorithm.init_args.noise.epsilon", "-2"],
        ["DPNoise", "epsilon must be positive, got -2.0"],
    ),
    (
        [QUICKSTART, "--model.algorithm.init_args.noise.delta", "1.0"],
        ["DPNoise", "delta must be in (0, 1), got 1.0"],
    ),
    (
        [QUICKSTART, "--data.init_args.partitioner.init_args.concentration", "0"],
        ["DirichletPartitioner", "concentration must be positive, got 0.0"],
    ),
    (
        [QUICKSTART, "--data.init_args.batch_size", "0"],
        ["DigitsDataModule", "batch_size must be a positive integer, got 0"],
    ),
    (
        [QUICKSTART, "--data.init_args.num_clients", "0"],
        ["DigitsDataModule", "num_clients must be a positive integer, got 0"],
    ),
    ([QUICKSTART, "--model.model.init_args.hidden_sizes", "[0]"], ["MLP", "hidden_sizes", "[0]"]),
    ([QUICKSTART, "--model.grad_backend", "fast"], ["model.grad_backend", "fast"]),
    ([QUICKSTART, "--trainer.max_steps", "abc"], ["trainer.max_steps", "abc", "int"]),
    (
        [QUICKSTART, "--model.algorithm.init_args.bogus", "1"],
        ["model.algorithm", "AlphaNormEC", "bogus", "not accepted"],
    ),
]


@pytest.mark.parametrize(
    "args, words", CONFIG_ERRORS, ids=[" ".join(map(str, a[1:]))[-60:] for a, _ in CONFIG_ERRORS]
)
def test_configuration_errors_are_one_line(args, words, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    line = fails(["fit", "--config", *map(str, args), *QUIET], capsys)
    for word in words:
        assert word in line
    assert not list(tmp_path.glob("**/*.ckpt"))


def test_config_file_empty_missing_or_not_a_mapping(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty.yaml").write_text("")  # today: "Unexpected config: " under the usage
    line = fails(["fit", "--config", "empty.yaml"], capsys)
    assert "--config empty.yaml is empty" in line and "trainer, model and data" in line
    line = fails(["fit", "--config", "missing.yaml"], capsys)
    assert line == "--config missing.yaml: no such file"
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    assert "holds a list, not a YAML mapping" in fails(["fit", "--config", "list.yaml"], capsys)


def test_debug_shows_the_traceback(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    args = ["fit", "--config", QUICKSTART, *QUIET, "--data.init_args.batch_size", "0"]
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        main([*args, "--debug"])
    monkeypatch.setenv("PL_PRIVFED_DEBUG", "1")
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        main(args)


def test_evaluation_interval_zero_is_refused_before_training(tmp_path, monkeypatch, capsys):
    """Today: ZeroDivisionError after the first round."""
    monkeypatch.chdir(tmp_path)
    line = fails(
        [
            "fit",
            "--config",
            QUICKSTART,
            *QUIET,
            "--trainer.max_steps",
            "3",
            "--trainer.val_check_interval",
            "0",
        ],
        capsys,
    )
    assert "trainer.val_check_interval must be a positive integer" in line and "got 0" in line
    assert not list(tmp_path.glob("**/*.ckpt"))


def test_batch_larger_than_every_shard_is_refused(tmp_path, monkeypatch, capsys):
    """Today: every client's minibatch silently repeated its shard."""
    monkeypatch.chdir(tmp_path)
    line = fails(
        ["fit", "--config", QUICKSTART, *QUIET, "--data.init_args.batch_size", "400"], capsys
    )
    assert "batch_size=400 is larger than every client's shard" in line
    assert "holds 204 examples" in line  # the quickstart's largest Dirichlet(0.5) shard


def test_a_damaged_checkpoint_is_named(tmp_path, monkeypatch, capsys):
    """Today: ``OSError: [Errno 22]`` or ``EOFError`` from inside torch.load."""
    monkeypatch.chdir(tmp_path)
    good = tmp_path / "good.ckpt"
    torch.save({"state_dict": {"w": torch.ones(1000)}, "global_step": 3}, good)
    data = good.read_bytes()
    cut = tmp_path / "cut.ckpt"
    cut.write_bytes(data[: len(data) // 2])
    for command in ("fit", "validate", "test"):
        line = fails([command, "--config", QUICKSTART, *QUIET, "--ckpt_path", str(cut)], capsys)
        assert f"ckpt_path {str(cut)!r}" in line and "not a complete PyTorch checkpoint" in line
    flipped = bytearray(data)
    start = data.index(b"\x00\x00\x80\x3f" * 4)  # inside the stored float32 ones
    flipped[start : start + 4] = b"\x00\x00\x00\x40"
    bad = tmp_path / "bad.ckpt"
    bad.write_bytes(bytes(flipped))
    line = fails(["validate", "--config", QUICKSTART, *QUIET, "--ckpt_path", str(bad)], capsys)
    assert f"ckpt_path {str(bad)!r} is damaged" in line and "CRC" in line
    line = fails(["fit", "--config", QUICKSTART, *QUIET, "--ckpt_path", "nowhere.ckpt"], capsys)
    assert line == "ckpt_path 'nowhere.ckpt': no such file"


MNIST_FILES = [
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
]


def mnist_args(data_dir):
    return [
        "fit",
        "--config",
        QUICKSTART,
        *QUIET,
        "--data",
        "pl_privfed.datamodules.MNISTDataModule",
        "--data.init_args.data_dir",
        str(data_dir),
    ]


def test_missing_mnist_names_the_file_the_directory_and_the_variable(tmp_path, monkeypatch, capsys):
    """Today: torchvision's "Dataset not found. You can use download=True to download it"."""
    monkeypatch.chdir(tmp_path)
    line = fails(mnist_args(tmp_path / "nowhere"), capsys)
    assert "MNIST not found" in line and "train-images-idx3-ubyte.gz" in line
    assert str(tmp_path / "nowhere" / "MNIST" / "raw") in line and "(data_dir)" in line
    monkeypatch.setenv("PL_PRIVFED_DATA", str(tmp_path / "elsewhere"))
    args = mnist_args(tmp_path)[:-2]  # no data_dir: $PL_PRIVFED_DATA
    line = fails(args, capsys)
    assert "from PL_PRIVFED_DATA" in line and str(tmp_path / "elsewhere") in line
    monkeypatch.delenv("PL_PRIVFED_DATA")
    line = fails(args, capsys)
    assert "the default ./data: set data_dir or PL_PRIVFED_DATA" in line


def test_truncated_mnist_is_named_and_nothing_is_downloaded(
    shared_data, tmp_path, monkeypatch, capsys
):
    """Today a truncated archive failed torchvision's md5 check, which then tried to download a
    replacement from the internet (and failed offline without naming the file)."""
    monkeypatch.chdir(tmp_path)
    raw = tmp_path / "data" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name in MNIST_FILES:
        shutil.copyfile(shared_data / "MNIST" / "raw" / name, raw / name)
    archive = raw / "train-images-idx3-ubyte.gz"
    archive.write_bytes(archive.read_bytes()[:100_000])

    def no_network(*args, **kwargs):
        raise AssertionError("the data module tried to download")

    monkeypatch.setattr("urllib.request.urlopen", no_network)
    line = fails(mnist_args(tmp_path / "data"), capsys)
    assert f"MNIST file {str(archive)!r} is truncated or corrupted" in line
    assert "100000 bytes" in line and "(data_dir)" in line
    # an extracted file cut short (an interrupted extraction) is named too
    shutil.copyfile(shared_data / "MNIST" / "raw" / MNIST_FILES[0], archive)
    (raw / "train-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x03" + b"\x00" * 100)
    for name in MNIST_FILES[1:]:
        (raw / name.removesuffix(".gz")).write_bytes(b"")
    line = fails(mnist_args(tmp_path / "data"), capsys)
    assert f"MNIST files in {str(raw)!r} cannot be read" in line and "delete the extracted" in line


def test_truncated_a9a_is_named(shared_data, tmp_path, monkeypatch, capsys):
    """Today: ``ValueError: need more than 1 value to unpack`` from scikit-learn."""
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "data" / "a9a"
    folder.mkdir(parents=True)
    (folder / "a9a").write_bytes((shared_data / "a9a" / "a9a").read_bytes()[:100_000])
    shutil.copyfile(shared_data / "a9a" / "a9a.t", folder / "a9a.t")
    args = [
        "fit",
        "--config",
        QUICKSTART,
        *QUIET,
        "--data",
        "pl_privfed.datamodules.A9ADataModule",
        "--data.init_args.data_dir",
        str(tmp_path / "data"),
    ]
    line = fails(args, capsys)
    assert f"a9a file {str(folder / 'a9a')!r} cannot be read as svmlight text" in line
    assert "truncated or corrupted" in line
    shutil.copyfile(shared_data / "a9a" / "a9a", folder / "a9a")
    (folder / "a9a.t").unlink()
    line = fails(args, capsys)
    assert "a9a file 'a9a.t' not found" in line and str(tmp_path / "data") in line


def test_a_diverged_run_is_one_line_with_status_1(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    line = fails(
        [
            "fit",
            "--config",
            str(ALGORITHMS / "ef21.yaml"),
            *QUIET,
            "--trainer.max_steps",
            "50",
            "--model.algorithm.init_args.step_size",
            "1e30",
        ],
        capsys,
        code=1,
    )
    assert line.startswith("non-finite training loss") and "at round" in line


@pytest.mark.slow
def test_stderr_is_one_line_in_a_real_process(tmp_path):
    """The console script as a user runs it: nothing else on stderr (no Lightning or W&B lines
    before the error, no traceback), with the quickstart's CSV and W&B loggers on; a reused
    ``--output_dir`` (another run's summary.json there) refused the same way, the summary kept."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    used = tmp_path / "used"
    used.mkdir()
    (used / "summary.json").write_text('{"status": "finished"}')
    cases = [
        (["--data.init_args.batch_size", "0"], "DigitsDataModule: batch_size must be"),
        (["--data.init_args.batch_size", "300"], "DigitsDataModule: batch_size=300 is larger"),
        (["--output_dir", str(used)], f"--output_dir {str(used)!r} holds another run already"),
    ]
    command = [sys.executable, "-m", "pl_privfed.cli", "fit", "--config", QUICKSTART]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True}
    # both at once: their start-ups (most of the time) overlap
    procs = [
        subprocess.Popen([*command, *override], cwd=tmp_path, env=env, **pipes)
        for override, _ in cases
    ]
    for proc, (_, expected) in zip(procs, cases):
        _, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 2, stderr
        (line,) = stderr.splitlines()
        assert line.startswith(f"pl-privfed: error: {expected}")
    assert (used / "summary.json").read_text() == '{"status": "finished"}'


def _files(tmp_path):
    """A file where a folder is expected, a binary config, a sweep file with a YAML error, a
    garbage and an empty results file, a folder without results.csv."""
    (tmp_path / "afile").write_text("x")
    (tmp_path / "binary.yaml").write_bytes(bytes(range(256)))
    (tmp_path / "bad_sweep.yaml").write_text("method: grid\nparameters: [\n")
    (tmp_path / "garbage.csv").write_bytes(b"\x00\x01garbage,\n\xff\xfe")
    (tmp_path / "text.csv").write_text("a,b\n1,2\n")
    (tmp_path / "header.csv").write_text("run,status,beta\n")
    (tmp_path / "empty").mkdir()


LOGGER_IN_FILE = (
    '{"class_path": "pytorch_lightning.loggers.CSVLogger", "init_args": {"save_dir": "afile/logs"}}'
)
# (command line, words the one line must hold); ``fit`` lines get QUIET and one round; today
# each ended in a traceback (exit 1) or was accepted
FIT_ERRORS = [
    (["--output_dir", "afile"], ["--output_dir 'afile' is a file, not a folder"]),
    (
        ["--trainer.default_root_dir", "afile/sub"],
        ["trainer.default_root_dir 'afile/sub' cannot be created: 'afile' is a file"],
    ),
    (
        ["--trainer.logger", LOGGER_IN_FILE],
        ["trainer.logger (CSVLogger) save_dir 'afile/logs'", "'afile' is a file"],
    ),
    (
        ["--model.client_state", "disk", "--model.state_dir", "afile/state"],
        ["model.state_dir 'afile/state' cannot be created", "'afile' is a file"],
    ),
    (["--seed", "-1"], ["--seed -1 is out of range", "from 0 to 4294967295"]),
    (["--seed", "99999999999999999999"], ["--seed 99999999999999999999 is out of range"]),
    (["--seed_everything", "-3"], ["--seed_everything -3 is out of range"]),
    (["--trainer.strategy", "fsdp"], ["trainer.strategy='fsdp' is not supported", "'ddp'"]),
    (["--trainer.accelerator", "tpu"], ["accelerator='tpu'", "cannot run here", "torch_xla"]),
    (["--trainer.max_steps", "0"], ["trainer.max_steps=0", "at least one round"]),
    (
        ["--model.algorithm.init_args.noise.epsilon", "null"],
        ["DPNoise: give exactly one of epsilon or noise_multiplier, got epsilon=None"],
    ),
    (
        ["--model.algorithm", "pl_privfed.algorithms.FederatedAlgorithm"],
        ["model.algorithm: pl_privfed.algorithms.FederatedAlgorithm is an abstract base class"],
    ),
    (
        [
            "--model.algorithm=pl_privfed.algorithms.base.FederatedAlgorithm"
        ],  # as wandb agent writes
        ["FederatedAlgorithm is an abstract base class"],
    ),
]


@pytest.mark.parametrize("extra, words", FIT_ERRORS, ids=[" ".join(a)[:50] for a, _ in FIT_ERRORS])
def test_fit_errors_are_one_line(extra, words, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _files(tmp_path)
    args = ["fit", "--config", QUICKSTART, *QUIET, "--trainer.max_steps", "1", *extra]
    line = fails(args, capsys)
    for word in words:
        assert word in line, line
    assert not list(tmp_path.glob("**/*.ckpt")) and not list(tmp_path.glob("**/summary.json"))


def test_max_steps_zero_is_refused_without_privacy_too(tmp_path, monkeypatch, capsys):
    """Today a non-private config ran 0 rounds and exited 0."""
    monkeypatch.chdir(tmp_path)
    line = fails(
        ["fit", "--config", str(ALGORITHMS / "ef21.yaml"), *QUIET, "--trainer.max_steps", "0"],
        capsys,
    )
    assert line.startswith("trainer.max_steps=0: a run trains at least one round")


# (subcommand line, words); today tracebacks (FileNotFoundError, IsADirectoryError,
# UnicodeDecodeError, yaml's ParserError without the file's name)
COMMAND_ERRORS = [
    (["fit", "--config", "binary.yaml"], ["--config binary.yaml is not a text (YAML) file"]),
    (["sweep", "nowhere.yaml", "--dry-run"], ["sweep file 'nowhere.yaml': no such file"]),
    (
        ["sweep", "bad_sweep.yaml", "--dry-run"],
        ["sweep file 'bad_sweep.yaml' is not valid YAML (line 3, column 1)"],
    ),
    (["report", "nowhere"], ["nowhere: no such results file", "pl-privfed sweep"]),
    (["report", "empty"], ["empty: a folder without results.csv"]),
    (["report", "empty/results.csv"], ["empty/results.csv: no such results file"]),
    (["report", "garbage.csv"], ["garbage.csv: not a results.csv"]),
    (
        ["report", "text.csv"],
        ["text.csv: not a results.csv written by `pl-privfed sweep` (no run or status column)"],
    ),
    (["report", "header.csv"], ["header.csv: an empty results file (no runs)"]),
    (["compare", "nowhere", "--out", "o"], ["nowhere: no such results file"]),
    (["compare", "empty", "--out", "o"], ["empty: a folder without results.csv"]),
    (["compare", "garbage.csv", "--out", "o"], ["garbage.csv: not a results.csv"]),
    (
        ["compare", "--frontier", "empty/results.csv", "--out", "o"],
        ["empty/results.csv: no such results file"],
    ),
]


@pytest.mark.parametrize(
    "args, words", COMMAND_ERRORS, ids=[" ".join(a)[:40] for a, _ in COMMAND_ERRORS]
)
def test_command_errors_are_one_line(args, words, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    _files(tmp_path)
    line = fails(args, capsys)
    for word in words:
        assert word in line, line


@pytest.mark.parametrize("value", ["0", "-5", "abc"])
def test_client_chunk_variable_is_checked(value, tmp_path, monkeypatch, capsys):
    """Today 0 and -5 were taken as chunks of one client, ``abc`` failed with int()'s
    message, not naming the variable."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PL_PRIVFED_CLIENT_CHUNK", value)
    line = fails(["fit", "--config", QUICKSTART, *QUIET, "--trainer.max_steps", "1"], capsys)
    assert f"PL_PRIVFED_CLIENT_CHUNK={value!r} is not a chunk size" in line
    assert "a positive integer" in line


def test_read_only_folders_are_named(tmp_path, monkeypatch, capsys):
    """A read-only folder (emulated: ``os.access`` answers as for an unprivileged user or a
    read-only mount, since root may write into a ``chmod 555`` folder) is refused before the
    run, naming the option; today the first file written ended in a ``PermissionError``."""
    monkeypatch.chdir(tmp_path)
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    monkeypatch.setattr(
        "os.access",
        lambda p, mode, **kw: Path(p).resolve() != locked and real_access(p, mode, **kw),
    )
    base = ["fit", "--config", QUICKSTART, *QUIET, "--trainer.max_steps", "1"]
    for extra, what in [
        (["--output_dir", "locked/run"], "--output_dir 'locked/run'"),
        (["--trainer.default_root_dir", "locked"], "trainer.default_root_dir 'locked'"),
        (["--model.client_state", "disk", "--model.state_dir", "locked/s"], "model.state_dir"),
    ]:
        line = fails([*base, *extra], capsys)
        assert line.startswith(what) and "is not writable" in line and "read-only" in line


def test_write_errors_during_a_run_are_one_line(tmp_path, capsys):
    """An ``OSError`` on a file (a folder that turned read-only or full during the run) is
    named in one line, not a traceback."""
    from pl_privfed.cli import error_line

    try:
        (tmp_path / "afile").write_text("x")
        (tmp_path / "afile" / "summary.json").write_text("{}")
    except OSError as exc:
        assert error_line(exc) == (
            f"cannot write {str(tmp_path / 'afile' / 'summary.json')!r}: Not a directory",
            2,
        )
    full = OSError(28, "No space left on device", "/logs/summary.json")
    assert error_line(full) == ("cannot write '/logs/summary.json': No space left on device", 1)


def test_a_nested_null_switches_epsilon_to_a_noise_multiplier(tmp_path, monkeypatch, capsys):
    """``--model.algorithm.init_args.noise.epsilon null`` with a noise multiplier: today
    "Expected a float; Expected a NoneType (given: None)"."""
    monkeypatch.chdir(tmp_path)
    main(
        [
            "fit",
            "--config",
            QUICKSTART,
            *QUIET,
            "--trainer.max_steps",
            "2",
            "--model.algorithm.init_args.noise.epsilon",
            "null",
            "--model.algorithm.init_args.noise.noise_multiplier=2.0",
            "--output_dir",
            "run",
        ]
    )
    import json

    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    noise = summary["config"]["model"]["algorithm"]["init_args"]["noise"]
    assert noise["epsilon"] is None and noise["noise_multiplier"] == 2.0
    assert summary["status"] == "finished" and summary["rounds"] == 2


ALLOCATOR_SNIPPET = """
import os, torch
from pl_privfed.cli import tune_allocator
tuned = tune_allocator()
def rss():
    return int(open('/proc/self/statm').read().split()[1]) * os.sysconf('SC_PAGE_SIZE')
x = torch.ones(4 * 2**20)  # 16 MiB, above glibc's initial mmap threshold (128 KiB)
before = rss()
del x
print(tuned, (before - rss()) // 2**20)
"""


ALLOCATOR_ENVS = [
    ({}, True),
    ({"PL_PRIVFED_MALLOC": "default"}, False),
    ({"MALLOC_TRIM_THRESHOLD_": "131072"}, False),
]


@pytest.fixture(scope="module")
def allocator_runs():
    """``ALLOCATOR_SNIPPET`` in a fresh process under each environment of ``ALLOCATOR_ENVS``,
    the three processes at once (their imports, most of their time, overlap; each measures its
    own resident memory): each one's stdout, stderr and exit status, in that order."""
    clean = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "PL_PRIVFED_MALLOC",
            "MALLOC_TRIM_THRESHOLD_",
            "MALLOC_MMAP_THRESHOLD_",
            "LD_PRELOAD",
        )
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", ALLOCATOR_SNIPPET],
            env={**clean, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for env, _ in ALLOCATOR_ENVS
    ]
    return [(*proc.communicate(timeout=300), proc.returncode) for proc in procs]


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
@pytest.mark.parametrize("case", range(len(ALLOCATOR_ENVS)), ids=["tuned", "default", "user"])
def test_the_command_keeps_freed_memory_for_reuse_unless_told_otherwise(case, allocator_runs):
    """``tune_allocator`` (called by ``main``): a freed 16 MiB block stays in the process (the
    next round reuses it instead of faulting its pages in again); the user's own choice wins."""
    stdout, stderr, code = allocator_runs[case]
    assert code == 0, stderr
    out = stdout.split()
    tuned = ALLOCATOR_ENVS[case][1]
    assert out[0] == str(tuned)
    returned_mib = int(out[1])
    assert returned_mib < 4 if tuned else returned_mib >= 12


def test_main_tunes_the_allocator(monkeypatch, capsys):
    import pl_privfed.cli as cli

    calls = []
    monkeypatch.setattr(cli.entry, "tune_allocator", lambda: calls.append(1) or True)
    with pytest.raises(SystemExit):
        cli.main(["report", "/nonexistent/results.csv"])
    assert calls == [1]


def test_a_distributed_run_that_may_abort_is_refused_in_one_line(tmp_path, monkeypatch, capsys):
    """Issue 29: distributed noise with t = 95 on a secret Poisson cohort of an expected 100
    (``mnist_dp_fedavg_clip``: 1,000 clients at q = 0.1) over K = 100 rounds aborted 30 rounds,
    and the abort pattern alone cost more ε against whoever sees the models than the ledger
    reported. Now refused before training, in one line naming t, the expected cohort, K, the
    probabilities (checked against scipy here) and the largest t that passes."""
    from scipy.stats import binom

    monkeypatch.chdir(tmp_path)
    noise = "--model.algorithm.init_args.noise."
    config = str(REPO / "configs/private/mnist_dp_fedavg_clip.yaml")
    line = fails(
        [
            "fit",
            "--config",
            config,
            *QUIET,
            "--trainer.max_steps",
            "100",
            f"{noise}placement",
            "distributed",
            f"{noise}min_contributors",
            "95",
        ],
        capsys,
    )
    per_round = binom.cdf(94, 1000, 0.1)
    assert 0.28 < per_round < 0.29  # the 30 aborted of 100
    assert "min_contributors=95 with an expected cohort of 100 clients" in line
    assert "(participation 0.1 of 1000) over K=100 rounds" in line
    assert f"a round aborts with probability {per_round:.3g}" in line
    assert f"at least one round with probability {1 - (1 - per_round) ** 100:.3g}" in line
    assert "above 1e-12" in line and "lower min_contributors to 36 or less" in line
    assert not list(tmp_path.glob("**/*.ckpt"))


def test_the_abort_bound_is_the_binomial_probability_of_any_abort():
    """P(cohort < t) is the binomial CDF (against a plain sum over the pmf); a run is refused
    where 1 − (1 − P(cohort < t))^K exceeds MAX_ABORT_PROBABILITY = 1e-12, and accepted just
    inside it: t = 36 of an expected 100 over 100 rounds passes (P = 5.5e-13), t = 37 does not
    (1.65e-12), each against scipy; the largest t is found by scanning scipy's CDF here.
    Unknown K is checked as one round; a fixed-size cohort or every client never aborts."""
    from math import comb

    from scipy.stats import binom

    from pl_privfed.privacy import (
        MAX_ABORT_PROBABILITY,
        DistributedNoise,
        Release,
        abort_probability,
        largest_min_contributors,
        run_abort_probability,
    )

    assert MAX_ABORT_PROBABILITY == 1e-12
    n, q = 12, 0.25
    for t in (1, 3, 4, 6):
        pmf = sum(comb(n, k) * q**k * (1 - q) ** (n - k) for k in range(t))
        assert abort_probability(t, n, q) == pytest.approx(pmf, abs=1e-12)
    n, q, k = 1000, 0.1, 100
    poisson = Release(unit="client", bound=1.0, participation=q, cohort="poisson", clients=n)

    def scipy_any(t, rounds=k):
        return 1 - (1 - binom.cdf(t - 1, n, q)) ** rounds

    for t in (36, 37, 95):
        assert run_abort_probability(t, n, q, k) == pytest.approx(scipy_any(t), rel=1e-9)
    assert scipy_any(36) < 1e-12 < scipy_any(37)
    DistributedNoise(36).check_rounds(poisson, k)  # just inside the bound: accepted
    with pytest.raises(ValueError, match=r"min_contributors=37 .* K=100 rounds.* 1\.65e-12"):
        DistributedNoise(37).check_rounds(poisson, k)
    largest = max(t for t in range(1, 100) if scipy_any(t) <= 1e-12)
    assert largest_min_contributors(n, q, k) == largest == 36
    assert largest_min_contributors(n, q, 1) == max(
        t for t in range(1, 100) if binom.cdf(t - 1, n, q) <= 1e-12
    )
    assert largest_min_contributors(5, 0.4, 4) == 0  # not even t = 1: P(no one) = 0.078
    with pytest.raises(ValueError, match=r"K=1 rounds.*no min_contributors stays below it"):
        DistributedNoise(1).check_rounds(
            Release(unit="client", bound=1.0, participation=0.4, cohort="poisson", clients=5),
            None,  # unknown K: one round
        )
    DistributedNoise(40).check_rounds(poisson, None)  # one round: 40 passes, not over 100
    DistributedNoise(37, allow_aborts=True).check_rounds(poisson, k)  # the opt-out
    fixed = Release(
        unit="client", bound=1.0, participation=0.1, cohort="fixed", clients=n, cohort_size=100
    )
    DistributedNoise(100).check_rounds(fixed, 10**6)  # a fixed cohort never aborts


def test_a_run_just_inside_the_abort_bound_is_set_up():
    """Through ``setup`` (what a run does before training, with its K): DP-FedAvg with a Poisson
    cohort of an expected 100 of 1,000 clients and distributed noise; t = 36 is set up for 100
    rounds, t = 37 refused, and t = 37 set up for one round (40 is one round's largest)."""
    from pl_privfed.algorithms import DPFedAvg
    from pl_privfed.operators import Clip
    from pl_privfed.privacy import DPNoise
    from pl_privfed.sampling import PoissonSampler

    def setup(t, rounds):
        noise = DPNoise(noise_multiplier=1.0, placement="distributed", min_contributors=t)
        alg = DPFedAvg(0.1, operator=Clip(1.0), sampler=PoissonSampler(0.1), noise=noise)
        alg.setup(num_clients=1000, dim=2, num_rounds=rounds)

    setup(36, 100)
    setup(37, 1)
    with pytest.raises(ValueError, match=r"min_contributors=37 .*over K=100 rounds"):
        setup(37, 100)


@pytest.mark.parametrize(
    ("variable", "value", "accepted"),
    [
        ("PL_PRIVFED_MALLOC", "garbage", "'tuned'"),
        ("PL_PRIVFED_DEBUG", "maybe", "0, false"),
        ("PL_PRIVFED_CHECK_INVARIANTS", "maybe", "0, false"),
        ("PL_PRIVFED_CLIENT_CHUNK", "-3", "'all' or 'auto'"),
    ],
)
def test_an_unknown_value_of_a_package_variable_is_one_line(
    tmp_path, monkeypatch, capsys, variable, value, accepted
):
    """Issue 30: ``PL_PRIVFED_MALLOC=garbage`` was accepted without a word; every variable of
    the package with a fixed set of values is checked before anything runs, in one line naming
    the variable, the value and what is accepted."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(variable, value)
    line = fails(["fit", "--config", QUICKSTART, *QUIET], capsys)
    assert line.startswith(f"{variable}={value!r}") and accepted in line
