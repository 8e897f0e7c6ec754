"""Sluice function worker for Python: runs one function of a user's module for one subtask of a pipeline.

Started by the engine as `python3 worker.py [--memory-mb N]` with the protocol on file descriptor 3 (one end of a
Unix stream socket pair, both directions); stdout and stderr go to the engine's log, so print() is safe.
The protocol is the Node.js worker's (runtime/node/worker.js, docs/functions.md "Protocol", version 2): frames of a
4-byte big-endian length and UTF-8 JSON; hello -> ready | fatal; batch -> result, one result per record in order.
An exact decimal travels as {"$decimal": "<digits>"}: the function gets a decimal.Decimal and may return one.
"""
import asyncio
import decimal
import importlib.util
import inspect
import json
import os
import resource
import socket
import struct
import sys
import traceback

PROTOCOL = 2
MAX_FRAME = 256 * 1024 * 1024


def main() -> None:
    if "--memory-mb" in sys.argv:
        limit = int(sys.argv[sys.argv.index("--memory-mb") + 1]) * 1024 * 1024
        # The address space, not the heap: Python has no heap limit of its own. Reaching it raises MemoryError.
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    # Sluice's decimals have up to 38 significant digits: arithmetic on them keeps that many (Python's default is 28).
    decimal.getcontext().prec = 38
    channel = socket.socket(fileno=3)
    reader = channel.makefile("rb")

    def encode_decimal(value):
        # json.dumps calls this for what JSON has no type for: a Decimal travels exactly, the rest is an error.
        if isinstance(value, decimal.Decimal):
            return {"$decimal": str(value)}
        raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")

    def dumps(obj) -> str:
        return json.dumps(obj, ensure_ascii=False, allow_nan=True, default=encode_decimal)

    def send_text(text: str) -> None:
        body = text.encode("utf-8")
        channel.sendall(struct.pack(">I", len(body)) + body)

    def send(obj) -> None:
        send_text(dumps(obj))

    def revive_decimal(obj):
        if len(obj) == 1 and isinstance(obj.get("$decimal"), str):
            return decimal.Decimal(obj["$decimal"])
        return obj

    def receive():
        header = reader.read(4)
        if len(header) < 4:
            return None  # the engine closed the channel
        (n,) = struct.unpack(">I", header)
        if n > MAX_FRAME:
            raise ValueError(f"a frame of {n} bytes is over the limit of {MAX_FRAME}")
        body = reader.read(n)
        if len(body) < n:
            return None
        # Only a frame that holds a decimal pays for the hook that revives them.
        if b'"$decimal"' in body:
            return json.loads(body.decode("utf-8"), object_hook=revive_decimal)
        return json.loads(body.decode("utf-8"))

    def user_stack(exc: BaseException) -> str:
        # The traceback from the user's frames on: the worker's own frame says nothing to the user.
        frames = traceback.extract_tb(exc.__traceback__)
        frames = [f for f in frames if os.path.abspath(f.filename) != os.path.abspath(__file__)]
        lines = ["Traceback (most recent call last):\n"] + traceback.format_list(frames)
        lines += traceback.format_exception_only(type(exc), exc)
        return "".join(lines).rstrip("\n")

    hello = receive()
    if hello is None:
        return
    if hello.get("protocol") != PROTOCOL:
        send({"type": "fatal", "message": f"protocol version {hello.get('protocol')} is not supported by this worker "
                                          f"(it speaks {PROTOCOL})", "stack": ""})
        return
    path = hello["module"]
    try:
        sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
        spec = importlib.util.spec_from_file_location("sluice_function_module", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    except BaseException as e:  # noqa: BLE001 - any failure to load is reported to the engine
        send({"type": "fatal", "message": f"cannot load module {path}: {type(e).__name__}: {e}",
              "stack": user_stack(e)})
        return
    fn = getattr(module, hello["export"], None)
    if not callable(fn):
        names = sorted(n for n in dir(module) if not n.startswith("_") and callable(getattr(module, n)))
        send({"type": "fatal", "message": f"module {path} has no function '{hello['export']}' "
                                          f"(functions: {', '.join(names) or 'none'})", "stack": ""})
        return
    send({"type": "ready", "protocol": PROTOCOL, "runtime": "python", "version": sys.version.split()[0]})
    loop = None
    while True:
        batch = receive()
        if batch is None:
            return
        if batch.get("type") != "batch":
            send({"type": "fatal", "message": f"unknown frame type '{batch.get('type')}'", "stack": ""})
            return
        results = []
        for record in batch["records"]:
            try:
                r = fn(record)
                if inspect.isawaitable(r):
                    loop = loop or asyncio.new_event_loop()
                    r = loop.run_until_complete(r)
                results.append({"ok": r})
            except MemoryError:
                print("sluice python worker: out of memory (the worker's memory limit was reached)", file=sys.stderr)
                sys.stderr.flush()
                os._exit(3)
            except Exception as e:  # noqa: BLE001 - a user's exception is a record error
                results.append({"error": {"message": f"{type(e).__name__}: {e}", "stack": user_stack(e)}})
        # One dumps for the whole batch; only when it fails is each result checked, and the one JSON cannot carry
        # becomes its record's error.
        try:
            text = dumps(results)
        except (TypeError, ValueError):
            for i, res in enumerate(results):
                if "ok" not in res:
                    continue
                try:
                    dumps(res["ok"])
                except (TypeError, ValueError) as e:
                    results[i] = {"error": {"message": f"the returned value cannot be sent as JSON: "
                                                       f"{type(e).__name__}: {e}", "stack": ""}}
            text = dumps(results)
        send_text('{"type":"result","id":' + str(int(batch["id"])) + ',"results":' + text + '}')


if __name__ == "__main__":
    main()
