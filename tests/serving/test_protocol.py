# SPDX-License-Identifier: Apache-2.0
import numpy as np
import pytest

from trtllm_dflash.errors import DFlashError
from trtllm_dflash.serving.detokenize import TextStream
from trtllm_dflash.serving.protocol import Result, final_outputs, parse_request


def _req(text=b"hello", **inputs):
    arrays = {"text_input": np.array([text], dtype=np.object_)}
    for name, value in inputs.items():
        arrays[name] = value if isinstance(value, np.ndarray) else np.array([value])
    return arrays


def test_defaults_and_values():
    r = parse_request(_req("héllo".encode()), {}, 64)
    assert (r.prompt, r.streaming, r.max_tokens, r.temperature, r.stop, r.echo) == (
        "héllo", False, None, None, (), False)
    r = parse_request(_req(streaming=np.array([True]), sampling_param_max_tokens=np.array([7], np.int32),
                           sampling_param_temperature=np.array([0.5], np.float32),
                           sampling_param_seed=np.array([2**63], np.uint64),
                           sampling_param_stop=np.array([b"\n\n", b"END"], dtype=np.object_),
                           sampling_param_ignore_eos=np.array([True])),
                      {"triton_enable_empty_final_response": True}, 64)
    assert (r.streaming, r.max_tokens, r.temperature, r.seed, r.stop) == (True, 7, 0.5, 2**63, ("\n\n", "END"))
    assert r.ignore_eos is True and parse_request(_req(), {}, 64).ignore_eos is None


@pytest.mark.parametrize("inputs, params, match", [
    (_req(b""), {}, "text_input: is empty"),
    (_req(b"\xff\xfe"), {}, "text_input: is not valid UTF-8"),
    ({"text_input": np.array([b"a", b"b"], dtype=np.object_)}, {}, "text_input: expected one prompt"),
    (_req(sampling_param_max_tokens=np.array([0], np.int32)), {}, r"max_tokens: must be in \[1, 63\], got 0"),
    (_req(sampling_param_max_tokens=np.array([-5], np.int32)), {}, "max_tokens: must be in"),
    (_req(sampling_param_max_tokens=np.array([64], np.int32)), {}, "got 64"),
    (_req(sampling_param_max_tokens=np.array([1.5], np.float32)), {}, "max_tokens: expected an integer"),
    (_req(sampling_param_max_tokens=np.array([1, 2], np.int32)), {}, "max_tokens: expected one value"),
    (_req(streaming=np.array([1], np.int32)), {}, "streaming: expected BOOL"),
    (_req(sampling_param_temperature=np.array([np.nan], np.float32)), {}, r"temperature: must be in \[0, 2.0\], got nan"),
    (_req(sampling_param_temperature=np.array([np.inf], np.float32)), {}, r"temperature: must be in \[0, 2.0\], got inf"),
    (_req(sampling_param_temperature=np.array([1e30], np.float32)), {}, r"temperature: must be in \[0, 2.0\], got 1e\+30"),
    (_req(sampling_param_top_p=np.array([0.0], np.float32)), {}, "top_p: must be in"),
    (_req(sampling_param_best_of=np.array([2], np.int32)), {}, "best_of: is 2"),
    (_req(sampling_param_stop=np.array([b""], dtype=np.object_)), {}, "stop: has an empty string"),
    (_req(image_url=np.array([b"x"], dtype=np.object_)), {}, "inputs: unknown 'image_url'"),
    (_req(), {"max_tokens": 5}, "parameters: unknown 'max_tokens'"),
])
def test_bad_requests_name_the_input(inputs, params, match):
    with pytest.raises(DFlashError, match=match):
        parse_request(inputs, params, 64)


def test_sizes_are_bounded_before_decoding():
    # #19 finding 4: a 40 MB prompt was tokenized whole before its length was checked; 100k stop strings
    with pytest.raises(DFlashError, match=r"text_input: is 4097 bytes, longer than any prompt .*\(4096 bytes at most"):
        parse_request(_req(b"x" * 4097), {}, 64, max_prompt_bytes=4096)
    assert parse_request(_req(b"x" * 4096), {}, 64, max_prompt_bytes=4096).prompt == "x" * 4096
    many = np.array([b"a"] * 100_000, dtype=np.object_)
    with pytest.raises(DFlashError, match="sampling_param_stop: has 100000 strings. Fix: send at most 32"):
        parse_request(_req(sampling_param_stop=many), {}, 64)
    with pytest.raises(DFlashError, match="sampling_param_stop: has a string longer than 256 bytes"):
        parse_request(_req(sampling_param_stop=np.array([b"a" * 257], dtype=np.object_)), {}, 64)
    assert parse_request(_req(), {"cancel_key": "s3cret"}, 64).prompt == "hello"


def test_final_outputs_types():
    out = final_outputs("tx", Result(finish_reason="length", num_draft_tokens=14, num_accepted_draft_tokens=7,
                                     times_ns={"arrival_time_ns": 5}), 2)
    assert out["sequence_length"].dtype == np.int32 and out["sequence_length"].tolist() == [2]
    assert out["text_output"].tolist() == [b"tx"] and out["finish_reason"].tolist() == [b"length"]
    assert out["acceptance_rate"].dtype == np.float32 and out["acceptance_rate"][0] == pytest.approx(0.5)
    assert out["total_draft_tokens"].dtype == np.int32 and out["arrival_time_ns"].dtype == np.int64
    assert out["first_token_time_ns"].tolist() == [0]


class ByteTokenizer:
    """Token id = one UTF-8 byte: multi-byte characters arrive in pieces, as with byte-level BPE."""

    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace")


def _ids(text: str) -> list[list[int]]:
    return [[b] for b in text.encode()]


def test_text_stream_holds_partial_characters():
    stream, pieces = TextStream(ByteTokenizer()), []
    for chunk in _ids("añb€c"):
        pieces.append(stream.push(chunk))
    pieces.append(stream.finish())
    assert "".join(pieces) == "añb€c" and "\ufffd" not in "".join(pieces)
    assert pieces[1:3] == ["", "ñ"]


def test_text_stream_stop_string_cuts_and_holds_prefix():
    stream, pieces = TextStream(ByteTokenizer(), stop=("END",)), []
    for chunk in _ids("abcENxEND tail"):
        pieces.append(stream.push(chunk))
        if stream.stopped:
            break
    assert "".join(pieces) == "abcENx" and stream.stop_reason == "END"
    assert pieces[3:5] == ["", ""]          # "E", "EN" held back: they could start "END"
    assert stream.finish() == ""


def test_text_stream_pieces_join_to_the_full_decode_with_the_real_tokenizer(smollm2_dir):
    # The offsets window (vLLM's) must give exactly what one decode of all ids gives: multi-byte characters
    # split across tokens, leading spaces, newlines, chunks of any size.
    import random

    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(smollm2_dir))
    text = ("def f(x):\n    return x * 2  # double it\n\nNaïve café — 東京タワー 🤖🚀 ok! "
            "Ünïcödé ∑∫√ résumé; 한국어 텍스트. Ελληνικά. \t tabs and  double  spaces.\n") * 3
    ids = tok.encode(text)
    rng = random.Random(0)
    assert TextStream(tok)._stream is not None          # SmolLM2's: tokenizers' DecodeStream
    for trial in range(40):
        stream, pieces, i = TextStream(tok), [], 0
        if trial % 2:
            stream._stream = None                        # the window path (tokenizers without a stream)
        sample = ids if trial < 20 else [rng.randrange(tok.vocab_size) for _ in range(200)]
        while i < len(sample):
            n = rng.choice([1, 1, 1, 2, 3, 5])
            pieces.append(stream.push(sample[i:i + n]))
            i += n
        pieces.append(stream.finish())
        assert "".join(pieces) == tok.decode(sample, skip_special_tokens=True), trial


def test_text_stream_decodes_only_the_tail():
    # Quadratic before: every update decoded the whole text. Now each update decodes a window of a few tokens.
    class Counting(ByteTokenizer):
        decoded = 0

        def decode(self, ids, skip_special_tokens=True):
            Counting.decoded += len(ids)
            return super().decode(ids)

    stream = TextStream(Counting(), stop=("STOP",))
    for chunk in _ids("x" * 4000):
        stream.push(chunk)
    assert stream.finish() == "" and stream.sent == 4000
    assert Counting.decoded < 4000 * 12      # ~2 windows of <= 6 tokens per update, whatever the length
