"""Broken cluster files: each mistake gives exactly one error, naming the file, the line and
the field, and saying what would be valid."""

import os
from pathlib import Path

import pytest

from specctl.config import ConfigError, load_config
from tests.control.deployment_cli import DEMO_DRAFT, local_cluster_file

from .cluster_files import EXAMPLES, MARK, SPARK_5090, replace_line, write_cluster, write_model

VERIFIER_HEADER = "[deployment.verifier]"
EIGHT_B_PATH = f'path = "{EXAMPLES}/models/llama-3.1-8b-instruct"'

# (what is wrong, [(line as written, line instead)], the error after "cluster.toml:LINE: ")
CASES = [
    (
        "missing field",
        [('model = "llama-70b"', "# no model"), (VERIFIER_HEADER, f"{VERIFIER_HEADER} {MARK}")],
        "deployment.verifier.model: required field missing: the name of one of the [[models]]",
    ),
    (
        "wrong type",
        [("port = 8000", f'port = "8000" {MARK}')],
        "server.port: Input should be a valid integer, got '8000'",
    ),
    (
        "unknown node",
        [('node = "rtx5090"', f'node = "gpu-b" {MARK}')],
        'deployment.drafter.node: unknown node "gpu-b"; nodes are: spark, rtx5090',
    ),
    (
        "unknown model",
        [('model = "llama-70b"', f'model = "llama-405b" {MARK}')],
        'deployment.verifier.model: unknown model "llama-405b"; models are: llama-70b, llama-8b',
    ),
    (
        "TOML syntax error",
        [("k = 4", f"k = {MARK}")],
        "invalid TOML: Invalid value (column 4)",
    ),
    (
        "layer counts that do not sum to the model's layers",
        [
            ('nodes = ["spark"]', 'nodes = ["spark", "rtx5090"]'),
            ('pipeline_split = "auto"', f"pipeline_split = [60, 16] {MARK}"),
        ],
        "deployment.verifier.pipeline_split: layer counts [60, 16] sum to 76, but llama-70b has "
        '80 layers; make them sum to 80, or use "auto"',
    ),
    (
        "one layer count per verifier node",
        [('pipeline_split = "auto"', f"pipeline_split = [40, 40] {MARK}")],
        "deployment.verifier.pipeline_split: 2 layer count(s) for 1 verifier node(s) (spark); "
        'give one count per node, or "auto"',
    ),
    (
        "a pipeline split that is neither auto nor counts",
        [('pipeline_split = "auto"', f'pipeline_split = "even" {MARK}')],
        'deployment.verifier.pipeline_split: must be "auto" or a list of layer counts, one per '
        "verifier node, e.g. [64, 16]; got 'even'",
    ),
    (
        "tensor parallel size that does not divide the heads",
        [("tensor_parallel_size = 1", f"tensor_parallel_size = 3 {MARK}")],
        "deployment.verifier.tensor_parallel_size: 3 does not divide llama-70b's 64 attention "
        "heads and 8 KV heads; valid sizes: 1, 2, 4, 8, 16, 32, 64",
    ),
    (
        "duplicate node name",
        [('name = "rtx5090"', f'name = "spark" {MARK}'), ('node = "rtx5090"', 'node = "spark"')],
        'nodes[1].name: duplicate name "spark" (also nodes[0])',
    ),
    (
        "k out of range",
        [("k = 4", f"k = 17 {MARK}")],
        "deployment.speculation.k: Input should be less than or equal to 16, got 17",
    ),
    (
        "port out of range",
        [("port = 8000", f"port = 70000 {MARK}")],
        "server.port: Input should be less than or equal to 65535, got 70000",
    ),
    (
        "misspelt field",
        [("tensor_parallel_size = 1", f"tensor_paralel_size = 1 {MARK}")],
        "deployment.verifier.tensor_paralel_size: unknown field; valid fields here: model, "
        "nodes, tensor_parallel_size, pipeline_split",
    ),
    (
        "specd address without a port",
        [('specd = "desktop.local:7601"', f'specd = "desktop.local" {MARK}')],
        "nodes[1].specd: must be \"local\" or host:port: 'desktop.local' is not of the form "
        "host:port",
    ),
    (
        "n-gram drafter given a node",
        [
            ('model = "llama-8b"', 'model = "ngram"'),
            ('node = "rtx5090"', f'node = "rtx5090" {MARK}'),
        ],
        "deployment.drafter.node: the n-gram drafter runs inside the verifier; remove node",
    ),
    (
        "n-gram drafter given a tensor-parallel size",
        [
            ('model = "llama-8b"', 'model = "ngram"'),
            ('node = "rtx5090"', f"tensor_parallel_size = 2 {MARK}"),  # instead of a node
        ],
        "deployment.drafter.tensor_parallel_size: the n-gram drafter has no model to split; "
        "remove tensor_parallel_size",
    ),
    (
        "k and adaptive together",
        [
            ('mode = "overlapped"', "adaptive = true"),
            ("[deployment.speculation]", f"[deployment.speculation] {MARK}"),
        ],
        "deployment.speculation: give k (fixed) or adaptive = true with max_k, not both",
    ),
    (
        "model path that is a file",
        [(EIGHT_B_PATH, f'path = "{EXAMPLES}/models/llama-3.1-8b-instruct/config.json" {MARK}')],
        f"models[1].path: {EXAMPLES}/models/llama-3.1-8b-instruct/config.json is a file; give "
        "the model directory (where config.json and the weights are)",
    ),
    (
        "deployment name Ray would be given with a space",
        [('name = "test"', f'name = "spark 5090" {MARK}')],
        "deployment.name: 'spark 5090' is not a valid name (1-63 letters, digits, '-', '_', "
        "'.', beginning and ending with a letter or digit)",
    ),
    (
        "empty api_key_file",
        [("port = 8000", f'port = 8000\napi_key_file = "" {MARK}')],
        "server.api_key_file: String should have at least 1 character, got ''",
    ),
    (
        "two nodes at one specd",
        [('specd = "desktop.local:7601"', f'specd = "spark.local:7601" {MARK}')],
        "nodes[1].specd: spark.local:7601 is also nodes[0]'s specd: one machine is one node "
        "(several GPUs of it go in its gpus)",
    ),
    (
        "model directory that does not exist",
        [
            (EIGHT_B_PATH, f'path = "/nonexistent/llama-8b" {MARK}'),
            (
                'specd = "desktop.local:7601"',
                'specd = "desktop.local:7601"\ntoken_file = "/nonexistent/cluster.token"',
            ),
        ],
        "models[1].path: model directory /nonexistent/llama-8b does not exist on this machine, "
        "nor on its nodes: node rtx5090: cannot ask its specd: /nonexistent/cluster.token: "
        "token file not found (create one with `specctl init`)",
    ),
    (
        "context longer than the model allows",
        [("max_model_len = 8192", f"max_model_len = 200000 {MARK}")],
        "models[0].max_model_len: 200000 exceeds llama-70b's max_position_embeddings 131072; "
        "use at most 131072",
    ),
    (
        "dtype nobody supports",
        [('dtype = "fp8"', f'dtype = "int4" {MARK}')],
        "models[0].dtype: Input should be 'auto', 'float32', 'bfloat16', 'float16' or 'fp8', "
        "got 'int4'",
    ),
    (
        "a label Ray would refuse",
        [
            (
                'specd = "spark.local:7601"',
                f'specd = "spark.local:7601"\nlabels = {{ "ray.io/x" = "y" }} {MARK}',
            )
        ],
        "nodes[0].labels: label key 'ray.io/x' uses a reserved prefix (ray.io/, specd.io/)",
    ),
    *(
        (
            f"server host {host!r} that cannot be bound",
            [('host = "127.0.0.1"', f'host = "{host}" {MARK}')],
            f"server.host: {host!r} is neither an IP address nor a host name",
        )
        for host in ("-", "...", "a..b", "-lead.example", "256.1.1.1")
    ),
]


@pytest.mark.parametrize(("what", "edits", "expected"), CASES, ids=[case[0] for case in CASES])
def test_one_clear_error_with_file_line_and_field(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    what: str,
    edits: list[tuple[str, str]],
    expected: str,
) -> None:
    text = SPARK_5090
    for old, new in edits:
        text = replace_line(text, old, new)
    _, line = write_cluster(tmp_path, text)
    assert line, what
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as caught:
        load_config("cluster.toml")
    assert [str(issue) for issue in caught.value.issues] == [f"cluster.toml:{line}: {expected}"]


def test_a_renamed_node_still_named_by_the_drafter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Renaming a node to another's name leaves the drafter's reference dangling: two errors,
    each at its own line, and the list of valid names names each node once."""
    path, _ = write_cluster(
        tmp_path, replace_line(SPARK_5090, 'name = "rtx5090"', 'name = "spark"')
    )
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as caught:
        load_config(path.name)
    messages = [str(issue).split(": ", 1)[1] for issue in caught.value.issues]
    assert messages == [
        'nodes[1].name: duplicate name "spark" (also nodes[0])',
        'deployment.drafter.node: unknown node "rtx5090"; nodes are: spark',
    ]


def test_the_unbroken_file_loads(tmp_path: Path) -> None:
    path, _ = write_cluster(tmp_path, SPARK_5090)
    config = load_config(path)
    assert config.deployment.drafter.node == "rtx5090"
    assert config.shape("llama-70b").num_layers == 80


def test_missing_section_names_the_field_without_a_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = SPARK_5090.split("[deployment]")[0]
    write_cluster(tmp_path, text)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as caught:
        load_config("cluster.toml")
    assert str(caught.value) == (
        "cluster.toml: deployment: required field missing: what runs where: [deployment]"
    )


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"absent\.toml: file not found"):
        load_config(tmp_path / "absent.toml")
    with pytest.raises(ConfigError, match=r": is a directory, not a file"):
        load_config(tmp_path)
    binary = tmp_path / "binary.toml"
    binary.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(ConfigError, match=r"binary\.toml: not UTF-8 text \(byte 0\)"):
        load_config(binary)


def test_a_byte_order_mark_is_not_part_of_the_file(tmp_path: Path) -> None:
    path, _ = write_cluster(tmp_path, SPARK_5090)
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert load_config(path).server.port == 8000


def test_unclosed_array_at_the_end_of_the_file(tmp_path: Path) -> None:
    path, _ = write_cluster(tmp_path, SPARK_5090 + 'extra = [\n  "a",\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    (issue,) = caught.value.issues
    assert issue.line == len(path.read_text().splitlines())
    assert issue.message == "invalid TOML: Invalid value (at the end of the file)"


def test_values_nested_too_deeply(tmp_path: Path) -> None:
    """tomllib recurses per level: 500 nested arrays raised RecursionError, a traceback."""
    path, _ = write_cluster(tmp_path, SPARK_5090 + "deep = " + "[" * 500 + "]" * 500 + "\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    (issue,) = caught.value.issues
    assert issue.line == len(path.read_text().splitlines())
    assert issue.message == "invalid TOML: values nested too deeply to read"


def test_draft_and_verifier_with_different_vocabularies(tmp_path: Path) -> None:
    write_model(tmp_path / "other-draft", vocab_size=32000, max_position_embeddings=131072)
    text = replace_line(SPARK_5090, EIGHT_B_PATH, f'path = "{tmp_path}/other-draft"')
    text = replace_line(text, 'model = "llama-8b"', f'model = "llama-8b" {MARK}')
    path, line = write_cluster(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == (
        f"{path}:{line}: deployment.drafter.model: llama-8b has a vocabulary of 32000, "
        "llama-70b of 128256: draft and verifier need the same tokenizer"
    )


def test_model_directory_without_config_json(tmp_path: Path) -> None:
    (tmp_path / "empty-model").mkdir()
    text = replace_line(SPARK_5090, EIGHT_B_PATH, f'path = "empty-model" {MARK}')
    path, line = write_cluster(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == (
        f"{path}:{line}: models[1].path: {tmp_path}/empty-model/config.json not found "
        "(a model directory holds a Hugging Face config.json)"
    )


@pytest.mark.parametrize(
    ("mode", "content", "expected"),
    [
        (0o600, "secret-key\n", None),
        (0o644, "secret-key\n", "has mode 0644: readable by others; chmod 600"),
        (0o640, "secret-key\n", "has mode 0640: readable by others; chmod 600"),
        (0o600, "\n", "is empty; it must hold the API key"),
        (None, None, "not found (a file holding the API key, mode 0600)"),
    ],
)
def test_api_key_file(
    tmp_path: Path, mode: int | None, content: str | None, expected: str | None
) -> None:
    key_file = tmp_path / "api.key"
    if content is not None and mode is not None:
        key_file.write_text(content)
        os.chmod(key_file, mode)
    text = replace_line(SPARK_5090, "port = 8000", f'port = 8000\napi_key_file = "api.key" {MARK}')
    path, line = write_cluster(tmp_path, text)
    if expected is None:
        assert load_config(path).api_key_path() == key_file
        return
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:{line}: server.api_key_file: {key_file}")
    assert expected in message


def test_a_model_missing_here_that_a_local_node_loads_says_so(tmp_path: Path) -> None:
    """A local node runs on this machine: the model must be here for it."""
    config = local_cluster_file(
        tmp_path / "cluster.toml", 8000, models=(tmp_path / "gone", DEMO_DRAFT, "float32")
    )
    with pytest.raises(ConfigError) as caught:
        load_config(config)
    assert str(caught.value).endswith(
        f"models[0].path: model directory {tmp_path / 'gone'} does not exist on this machine, "
        "where node verifier-node would load it (a local node runs here)"
    ), str(caught.value)
