"""data.format=chat end to end: a tiny Llama 3 (byte-level BPE with <|start_header_id|> and
<|eot_id|>) and a tiny Gemma (SentencePiece with <start_of_turn> and <end_of_turn>), each
LoRA-tuned on 40 three-turn conversations on a 2x4 mesh until it answers a held-out conversation's
last user turn with the trained reply and stops at the end of its turn; `meshrun generate` with a
conversation (turn flags, or --chat JSON) gives that reply. And every bad conversation input is
one line with exit 2 before anything trains."""

import json

import pytest

from conftest import train_here
from meshrun import cli
from presets import chat_records, corpus_text, gemma_preset, held_out_chat, llama3_preset

pytestmark = pytest.mark.integration

# Each family's run: its layout, learning rate and epochs (the tiny Llama's logits start flatter
# and take a smaller step for longer), the layers that get adapters, and their rank.
FAMILIES = {
    "llama3": (
        "llama_tp",
        "0.01",
        "40",
        "query,key,value,attention_output,feedforward_intermediate_dense,feedforward_gate_dense,"
        "feedforward_output_dense",
        16,
    ),
    "gemma": (
        "gemma_tp",
        "0.03",
        "30",
        "query,key,value,attention_output,ffw_gating,ffw_gating_2,ffw_linear",
        4,
    ),
}
SAMPLES = {"What colour is coal?": "black", "What colour is a plum?": "purple"}


@pytest.fixture(scope="module")
def chats(tmp_path_factory):
    """The two presets (their tokenizers trained on text and the conversations' words) and the
    conversations file."""
    root = tmp_path_factory.mktemp("chat")
    records = chat_records(40)
    words = "\n".join(turn["content"] for record in records for turn in record["messages"])
    text = corpus_text(20_000) + "\n\n" + words
    (root / "chats.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return {
        "llama3": llama3_preset(root / "llama3", text),
        "gemma": gemma_preset(root / "gemma", text),
        "root": root,
    }


def chat_run(chats, family: str, *extra) -> list[str]:
    layout, rate, epochs, targets, rank = FAMILIES[family]
    return [
        "model=keras_hub",
        f"model.preset={chats[family]}",
        "mesh=2x4",
        f"layout={layout}",
        "data=text",
        "data.format=chat",
        f"data.files={chats['root'] / 'chats.jsonl'}",
        f"data.cache_dir={chats['root'] / 'tokens'}",
        "model.seq_len=96",
        "data.too_long=truncate",
        f"model.lora.rank={rank}",
        f"model.lora.targets=[{targets}]",
        "train.batch_size=8",
        f"train.epochs={epochs}",
        f"train.learning_rate={rate}",
        "train.verbose=0",
        *extra,
    ]


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def trained(request, chats):
    family = request.param
    run_dir = chats["root"] / f"run-{family}"
    metrics = train_here(
        chat_run(chats, family, f"train.sample_prompts={json.dumps(list(SAMPLES))}"), run_dir
    )
    return family, run_dir, metrics


def test_a_lora_chat_fine_tune_learns_the_replies_and_to_end_its_turn(trained):
    family, _, metrics = trained
    losses = metrics["history"]["loss"]
    assert losses[-1] < losses[0]
    data = metrics["data"]
    assert data["format"] == "chat" and not data["packed"] and data["dropped_too_long"] == 0
    # the tiny Llama 3's headers take more tokens: 12 conversations lose their first exchange to fit 96
    assert data["truncated_too_long"] == {"llama3": 12, "gemma": 0}[family]
    assert data["chat_template_used"] == f"meshrun's built-in {family} template"
    # the replies are one word: the completion stopping right after it is the end-of-turn token's doing
    assert {s["prompt"]: s["completion"] for s in metrics["samples"]} == SAMPLES


def test_generate_answers_a_held_out_conversation_with_the_trained_reply(trained, capsys):
    _, run_dir, _ = trained
    messages, reply = held_out_chat()
    flags = [item for turn in messages for item in (f"--{turn['role']}", turn["content"])]
    capsys.readouterr()
    cli.main(["generate", str(run_dir), *flags, "--json"])
    [by_flags] = json.loads(capsys.readouterr().out)
    assert by_flags["completion"] == reply and by_flags["messages"] == messages
    cli.main(
        [
            "generate",
            str(run_dir),
            "--chat",
            json.dumps({"messages": messages}),
            "--chat",
            json.dumps(messages[-1:]),
        ]
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"{messages[-1]['content']!r} -> {reply!r}"] * 2


@pytest.mark.parametrize(
    "name, change, expected",
    [
        (
            "no messages",
            {"record": {"text": "hi"}},
            "data.files: {file}:1 has no 'messages' (its fields: text)",
        ),
        (
            "a turn without content",
            {"record": {"messages": [{"role": "user"}, {"role": "assistant", "content": "x"}]}},
            "data.files: {file}:1 turn 1 (user) has no 'content'",
        ),
        (
            "an unknown role",
            {"record": {"messages": [{"role": "human", "content": "hi"}]}},
            'data.files: {file}:1 turn 1 has role "human"; valid: system, user or assistant',
        ),
        (
            "a last user turn",
            {"record": {"messages": [{"role": "user", "content": "hi"}]}},
            "data.files: {file}:1 ends with a user turn, so it has nothing to learn",
        ),
        (
            "a template that fails",
            {"template": "{% for m in messages %}\n{{ raise_exception('one turn only') }}{% endfor %}"},
            "data.chat_template: the template {template} fails on {chats}:1 at its line 2: one turn only",
        ),
        (
            "no template file",
            {"args": ["data.chat_template=nope.jinja"]},
            "data.chat_template: got 'nope.jinja'",
        ),
        (
            "text settings",
            {"args": ["data.prompt=Q", "data.completion=A"]},
            "data.prompt: is set with data.format=chat",
        ),
    ],
)
def test_bad_chat_input_is_one_line_with_exit_2(chats, tmp_path, capsys, name, change, expected):
    args = list(change.get("args", []))
    file = tmp_path / "bad.jsonl"
    if "record" in change:
        file.write_text(json.dumps(change["record"]) + "\n")
        args.append(f"data.files={file}")
    template = tmp_path / "t.jinja"
    if "template" in change:
        template.write_text(change["template"])
        args.append(f"data.chat_template={template}")
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_:
        cli.main(
            [
                "train",
                *chat_run(chats, "gemma", *args),
                f"data.cache_dir={tmp_path / 'tokens'}",
                f"hydra.run.dir={tmp_path / 'run'}",
            ]
        )
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and "Traceback" not in "\n".join(err)
    line = expected.format(file=file, template=template, chats=chats["root"] / "chats.jsonl")
    assert err[-1].startswith(f"meshrun: error: {line}"), err[-1]
    assert not (tmp_path / "tokens").exists() or not any((tmp_path / "tokens").rglob("meta.json"))
