"""llama.cpp's own OpenAI-compatible server (through xllamacpp) in a child process: `python llama_server.py MODEL
PORT ALIAS [SLOTS]`. Runs until terminated. A real third-party server for the tests: with one slot (the default)
it refuses `n > 1`; with several it answers n choices and counts the first alone in its usage."""

import signal
import sys
import threading

import xllamacpp

from gym_tf.backends.embedded import server_params

model, port, alias = sys.argv[1], int(sys.argv[2]), sys.argv[3]
slots = int(sys.argv[4]) if len(sys.argv) > 4 else 1
params = server_params(model, n_ctx=4096, threads=None, port=port, slots=slots)
params.model_alias = {alias}
server = xllamacpp.Server(params)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
stop.wait()
