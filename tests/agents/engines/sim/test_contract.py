"""The simulator speaks SGLang 0.5.23's HTTP API, as a real child process: what it alone can
show (faults, PD hand-over, its scheduler). test_conformance.py holds it to the real server."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from agents.engines import tiny_model
from agents.engines.tokenizers import HfTokenizer
from meridian.procs import free_port
from tests.kits.sim import Sim, running_sim, sse

JSON = {"content-type": "application/json"}
# (a labelled series shows once it has a value, as SGLang's: no abort here, so no
# num_aborted_requests_total)
METRICS = [
    "sglang:prompt_tokens_total",
    "sglang:generation_tokens_total",
    "sglang:cached_tokens_total",
    "sglang:num_requests_total",
    "sglang:time_to_first_token_seconds_bucket",
    "sglang:inter_token_latency_seconds_bucket",
    "sglang:request_time_per_output_token_seconds_bucket",
    "sglang:e2e_request_latency_seconds_bucket",
    "sglang:queue_time_seconds_bucket",
    "sglang:num_running_reqs",
    "sglang:num_queue_reqs",
    "sglang:num_used_tokens",
    "sglang:token_usage",
    "sglang:gen_throughput",
    "sglang:cache_hit_rate",
    "sglang:max_total_num_tokens",
    "sglang:num_decode_transfer_queue_reqs",
]


@pytest.fixture(scope="module")
async def sim() -> object:
    async with running_sim("--enable-metrics", "--enable-cache-report", model="llama-8b") as s:
        yield s


async def test_info_endpoints_describe_a_local_model_directory(sim: Sim) -> None:
    async with sim.client() as client:
        for path in ("/model_info", "/get_model_info"):
            info = (await client.get(path)).json()
            assert info["is_generation"] is True
            model_dir = Path(info["model_path"])
            assert (model_dir / "tokenizer.json").is_file()
            assert "chat_template" in (model_dir / "tokenizer_config.json").read_text()
        for path in ("/server_info", "/get_server_info"):
            server = (await client.get(path)).json()
            assert server["served_model_name"] == "llama-8b"
            assert server["tp_size"] == 1
            assert server["disaggregation_mode"] == "null"
            assert server["max_total_num_tokens"] > 0  # at the top level, as 0.5.23 has it
            assert "max_total_num_tokens" not in server["internal_states"][0]
            assert server["version"]
        models = (await client.get("/v1/models")).json()
        assert models["object"] == "list"
        assert models["data"][0]["id"] == "llama-8b"
        assert models["data"][0]["max_model_len"] == 131072
        loads = (await client.get("/v1/loads")).json()
        assert set(loads["loads"][0]) >= {"dp_rank", "num_running_reqs", "num_waiting_reqs",
                                          "num_used_tokens", "max_total_num_tokens"}  # fmt: skip
        assert (await client.get("/get_load")).status_code == 404  # gone in 0.5.23
        assert (await client.get("/ready")).status_code == 200
        assert (await client.get("/health_generate")).status_code == 200


async def test_generate_counts_the_cached_prefix_on_a_repeat(sim: Sim) -> None:
    body = {
        "text": "a prompt about the cache and its prefix",
        "sampling_params": {"max_new_tokens": 6},
    }
    async with sim.client() as client:
        await client.post("/flush_cache")
        first = (await client.post("/generate", json=body, headers=JSON)).json()
        again = (await client.post("/generate", json=body, headers=JSON)).json()
    meta = first["meta_info"]
    assert meta["prompt_tokens"] == 8
    assert meta["completion_tokens"] == 6
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert len(first["output_ids"]) == 6
    assert first["text"]
    assert meta["cached_tokens"] == 0
    # As SGLang, the last prompt token is always computed again (its logits start decoding).
    assert again["meta_info"]["cached_tokens"] == 7
    assert again["output_ids"] == first["output_ids"]


async def test_generate_streams_cumulative_text_then_done(sim: Sim) -> None:
    body = {"input_ids": [5, 6, 7, 8], "sampling_params": {"max_new_tokens": 4}, "stream": True}
    async with sim.client() as client, client.stream("POST", "/generate", json=body) as response:
        events = await sse(response)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert [len(c["output_ids"]) for c in chunks] == [1, 2, 3, 4]
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert chunks[-1]["text"].startswith(chunks[0]["text"])


async def test_chat_streams_chunks_with_usage_and_reads_max_completion_tokens(sim: Sim) -> None:
    body = {
        "model": "llama-8b",
        "messages": [{"role": "user", "content": "say three things"}],
        "max_tokens": 50,
        "max_completion_tokens": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
        "some_unknown_field": {"ignored": True},
    }
    async with (
        sim.client() as client,
        client.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        assert response.status_code == 200
        events = await sse(response)
    assert events[-1] == "[DONE]"
    content, usage = events[:-2], events[-2]
    assert all(c["object"] == "chat.completion.chunk" for c in content)
    first = {"role": "assistant", "content": "", "reasoning_content": None}  # as SGLang's
    assert content[0]["choices"][0]["delta"] == first
    # the finish reason in a chunk of its own, its delta empty
    assert [c["choices"][0]["finish_reason"] for c in content] == [None] * 4 + ["length"]
    assert content[-1]["choices"][0]["delta"] == {"reasoning_content": None}
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 3
    assert usage["usage"]["total_tokens"] == usage["usage"]["prompt_tokens"] + 3
    assert "cached_tokens" in usage["usage"]["prompt_tokens_details"]


async def test_completions_answer_in_openai_shape(sim: Sim) -> None:
    body = {"model": "llama-8b", "prompt": "once upon a time", "max_tokens": 5}
    async with sim.client() as client:
        answer = (await client.post("/v1/completions", json=body)).json()
        async with client.stream(
            "POST", "/v1/completions", json={**body, "stream": True}
        ) as response:
            events = await sse(response)
    assert answer["object"] == "text_completion"
    assert answer["choices"][0]["finish_reason"] == "length"
    assert answer["usage"]["completion_tokens"] == 5
    assert [e["object"] for e in events[:-1]] == ["text_completion"] * 5
    assert all(e["usage"] is None for e in events[:-1])
    streamed = "".join(e["choices"][0]["text"] for e in events[:-1])
    assert streamed == answer["choices"][0]["text"]


async def test_bad_requests_get_sglang_errors(sim: Sim) -> None:
    async with sim.client() as client:
        not_json = await client.post("/v1/chat/completions", content="hello")
        no_messages = await client.post("/v1/chat/completions", json={"model": "x", "messages": []})
        both = await client.post("/generate", json={"text": "a", "input_ids": [1]})
        negative = await client.post("/v1/completions", json={"prompt": "a", "max_tokens": -1})
    for response in (not_json, no_messages, negative):
        assert response.status_code == 400
        error = response.json()
        assert error["object"] == "error"
        assert error["code"] == 400
        assert error["message"]
    assert both.status_code == 400
    assert set(both.json()) == {"error"}  # /generate's own shape
    assert both.json()["error"]["message"]


async def test_metrics_use_sglang_names_and_labels(sim: Sim) -> None:
    async with sim.client() as client:
        await client.post(
            "/generate", json={"text": "count me", "sampling_params": {"max_new_tokens": 3}}
        )
        text = (await client.get("/metrics")).text
    for name in METRICS:
        assert f"\n{name}{{" in text, name
    assert 'engine_type="unified"' in text
    assert 'tp_rank="0"' in text
    assert 'model_name="llama-8b"' in text


async def test_flush_cache_forgets_prefixes_and_refuses_while_busy() -> None:
    async with running_sim("--slow-factor", "30") as sim, sim.client() as client:
        body = {"text": "remember this prefix please", "sampling_params": {"max_new_tokens": 1}}
        await client.post("/generate", json=body)
        busy = asyncio.create_task(
            client.post(
                "/generate", json={"text": "long one", "sampling_params": {"max_new_tokens": 10}}
            )
        )
        await _until_running(client)
        refused = await client.post("/flush_cache")
        await busy
        flushed = await client.post("/flush_cache")
        after = (await client.post("/generate", json=body)).json()
    assert refused.status_code == 400
    assert flushed.status_code == 200
    assert flushed.text.startswith("Cache flushed.")
    assert refused.text == "Flush cache failed.\n"
    assert after["meta_info"]["cached_tokens"] == 0


async def test_stream_interval_spaces_the_chunks() -> None:
    async with running_sim("--stream-interval", "4") as sim, sim.client() as client:
        body = {"text": "x", "sampling_params": {"max_new_tokens": 9}, "stream": True}
        async with client.stream("POST", "/generate", json=body) as response:
            events = await sse(response)
    assert [len(e["output_ids"]) for e in events[:-1]] == [1, 4, 8, 9]


async def test_a_full_batch_queues_the_rest() -> None:
    args = ("--max-running-requests", "1", "--slow-factor", "10")
    async with running_sim(*args) as sim, sim.client() as client:
        body = {"text": "wait your turn", "sampling_params": {"max_new_tokens": 10}}
        calls = [asyncio.create_task(client.post("/generate", json=body)) for _ in range(3)]
        for _ in range(100):  # until all three have arrived and the scheduler took one
            load = (await client.get("/v1/loads")).json()["loads"][0]
            arrived = load["num_running_reqs"] + load["num_waiting_reqs"]
            if arrived == 3 and load["num_waiting_reqs"] < 3:
                break
            await asyncio.sleep(0.02)
        answers = await asyncio.gather(*calls)
    assert load["num_waiting_reqs"] == 2
    assert load["num_running_reqs"] == 1
    assert all(a.status_code == 200 for a in answers)


async def test_faults_by_admin_endpoint() -> None:
    async with running_sim() as sim, sim.client(timeout=2) as client:
        body = {"text": "fault", "sampling_params": {"max_new_tokens": 2}}
        await client.post("/sim/faults", json={"error_rate": 1.0})
        failed = await client.post("/generate", json=body)
        await client.post("/sim/faults", json={"error_rate": 0.0, "hang": True})
        with pytest.raises(httpx.ReadTimeout):
            await client.get("/health")
        with pytest.raises(httpx.ReadTimeout):  # asked of the scheduler, as SGLang's
            await client.get("/v1/loads")
        assert (await client.get("/ready")).status_code == 200  # asks nothing of it
        stuck = asyncio.create_task(client.post("/generate", json=body, timeout=10))
        await asyncio.sleep(0.3)
        assert not stuck.done()
        await client.post("/sim/faults", json={"hang": False})
        released = await stuck
        bad = await client.post("/sim/faults", json={"slow_factor": 0})
        await client.post("/sim/faults", json={"crash": True})
        code = await asyncio.wait_for(sim.process.wait(), 5)
    assert failed.status_code == 500
    assert failed.json()["object"] == "error"
    assert released.status_code == 200
    assert bad.status_code == 400
    assert code == 70


async def test_faults_by_flag_crash_after() -> None:
    # long enough for its first request to be answered on a loaded machine before it dies
    async with running_sim("--crash-after-s", "3", "--error-rate", "1") as sim:
        async with sim.client() as client:
            failed = await client.post("/generate", json={"text": "x"})
        assert await asyncio.wait_for(sim.process.wait(), 10) == 70
    assert failed.status_code == 500


async def test_prefill_and_decode_hand_over_the_kv_cache() -> None:
    bp = free_port()
    async with (
        running_sim(
            "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(bp)
        ) as prefill,
        running_sim("--disaggregation-mode", "decode", "--enable-metrics") as decode,
    ):
        body = {
            "text": "a disaggregated request",
            "sampling_params": {"max_new_tokens": 5},
            "bootstrap_host": "127.0.0.1",
            "bootstrap_port": bp,
            "bootstrap_room": 12345,
        }
        async with prefill.client() as p, decode.client() as d:
            prefilled, decoded = await asyncio.gather(
                p.post("/generate", json=body), d.post("/generate", json=body)
            )
            local = await d.post(
                "/generate", json={"text": "no bootstrap", "sampling_params": {"max_new_tokens": 3}}
            )
            partial = await d.post("/generate", json={"text": "half", "bootstrap_room": 7})
            metrics = (await d.get("/metrics")).text
    assert prefilled.json()["meta_info"]["completion_tokens"] == 1
    out = decoded.json()["meta_info"]
    assert out["completion_tokens"] == 5
    assert out["cached_tokens"] == out["prompt_tokens"]
    # Named no prefill server: the decode server prefilled it itself.
    assert local.status_code == 200
    assert local.json()["meta_info"]["completion_tokens"] == 3
    assert local.json()["meta_info"]["cached_tokens"] == 0
    assert partial.status_code == 400
    assert 'engine_type="decode"' in metrics
    assert "sglang:kv_transfer_latency_ms_bucket{" in metrics  # registered in PD mode only


async def _until_running(client: httpx.AsyncClient) -> None:
    for _ in range(100):
        if (await client.get("/v1/loads")).json()["loads"][0]["num_running_reqs"] > 0:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("no request started")


async def test_kv_events_are_published_over_zmq_in_sglang_format() -> None:
    import msgpack
    import zmq
    import zmq.asyncio

    events_port = free_port()
    config = f'{{"publisher":"zmq","endpoint":"tcp://127.0.0.1:{events_port}","topic":"kv-events"}}'
    context = zmq.asyncio.Context()
    socket = context.socket(zmq.SUB)
    socket.setsockopt(zmq.SUBSCRIBE, b"kv-events")
    socket.connect(f"tcp://127.0.0.1:{events_port}")
    try:
        async with running_sim("--kv-events-config", config, "--page-size", "4") as sim:
            ids = list(range(100, 110))  # 10 tokens: two whole pages of 4
            async with sim.client() as client:
                # a subscription reaches the publisher a moment after it binds (ZMQ's slow
                # joiner): flush until an event comes through, then read from a clean start
                for _ in range(100):
                    assert (await client.post("/flush_cache")).status_code == 200
                    if await socket.poll(100):
                        break
                while await socket.poll(200):
                    await socket.recv_multipart()
                body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 2}}
                assert (await client.post("/generate", json=body, headers=JSON)).status_code == 200
                assert (await client.post("/flush_cache")).status_code == 200
            stored: list[dict[str, Any]] = []
            cleared = False
            seqs = []
            while not cleared:
                topic, seq, payload = await asyncio.wait_for(socket.recv_multipart(), 5)
                assert topic == b"kv-events"
                seqs.append(int.from_bytes(seq, "big"))
                ts, events, dp_rank = msgpack.unpackb(payload)
                assert isinstance(ts, float)
                assert dp_rank == 0
                for event in events:
                    if event["type"] == "BlockStored":
                        stored.append(event)
                    cleared = cleared or event["type"] == "AllBlocksCleared"
    finally:
        socket.close(linger=0)
        context.term()
    assert seqs == sorted(seqs)
    # The prompt's two whole pages in one event, then (prompt + 2 generated = 12 tokens) a
    # third: a hash a page
    first, second = stored
    assert first["token_ids"] == ids[0:8]
    assert len(first["block_hashes"]) == 2
    assert first["parent_block_hash"] is None  # the root's page has no parent
    assert second["token_ids"][:2] == ids[8:10]
    assert len(second["block_hashes"]) == 1
    assert second["parent_block_hash"] == first["block_hashes"][-1]
    assert all(e["block_size"] == 4 and e["medium"] == "GPU" for e in stored)


async def test_an_answer_continued_from_its_first_tokens_goes_on_as_the_whole_did(
    sim: Sim,
) -> None:
    """The contract a migrated stream relies on: the output is a function of the context, so
    the prompt with the answer so far (chat: an open final assistant message, SGLang's
    `continue_final_message`; completions and /generate: the prompt's text and the answer's)
    goes on with the tokens the uninterrupted answer had, with no seam in the text."""
    messages = [{"role": "user", "content": "tell a long story"}]
    async with sim.client() as client:
        chat = {"model": "llama-8b", "messages": messages, "max_tokens": 12, "rid": "r-1"}
        whole = (await client.post("/v1/chat/completions", json=chat)).json()
        assert whole["id"] == "r-1"  # SGLang's answers carry the rid as their id
        text = whole["choices"][0]["message"]["content"]
        words = text.split(" ")
        assert not text.startswith(" ")
        assert len(words) == 12
        head = " ".join(words[:5])
        rest = {**chat, "max_tokens": 7, "continue_final_message": True,
                "messages": [*messages, {"role": "assistant", "content": head}]}  # fmt: skip
        more = (await client.post("/v1/chat/completions", json=rest)).json()
        assert head + more["choices"][0]["message"]["content"] == text
        assert more["usage"]["prompt_tokens"] == whole["usage"]["prompt_tokens"] + 5

        prompt = "once upon a time"
        done = {"model": "llama-8b", "prompt": prompt, "max_tokens": 9}
        full = (await client.post("/v1/completions", json=done)).json()["choices"][0]["text"]
        assert full.startswith(" ")  # it follows the prompt's last word
        cut = " ".join(full.split(" ")[:4])  # the leading space and three words
        rest = {**done, "prompt": prompt + cut, "max_tokens": 6}
        more = (await client.post("/v1/completions", json=rest)).json()
        assert cut + more["choices"][0]["text"] == full

        ids = [11, 12, 13]
        first = (await client.post("/generate", json={"input_ids": ids,
                 "sampling_params": {"max_new_tokens": 8}})).json()  # fmt: skip
        rest = (await client.post("/generate", json={"input_ids": ids + first["output_ids"][:3],
                "sampling_params": {"max_new_tokens": 5}})).json()  # fmt: skip
        assert first["output_ids"][:3] + rest["output_ids"] == first["output_ids"]


async def test_given_a_model_directory_it_counts_with_that_tokenizer(tmp_path: Path) -> None:
    """Started at the tiny model (as SGLang serving it would be), the simulator tokenizes and
    renders the chat template with that directory's tokenizer, as the router does for it."""
    model = tiny_model.write(tmp_path / "tiny")
    messages = [{"role": "user", "content": "Hello, how are you? Tell me about the river."}]
    expected = len(HfTokenizer(model).chat(messages))
    async with running_sim("--model-path", str(model)) as sim, sim.client() as client:
        chat = {"model": "llama", "messages": messages, "max_tokens": 4}
        answer = (await client.post("/v1/chat/completions", json=chat)).json()
        info = (await client.get("/server_info")).json()
    assert answer["usage"]["prompt_tokens"] == expected
    assert info["tokenizer_path"] == str(model)
