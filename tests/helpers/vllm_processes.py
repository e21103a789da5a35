"""vLLM's process tree, as vLLM 0.33 starts it, with its own logging and plugin loader.

Each stand-in entry point runs, in order, the calls vLLM's real one makes about plugins and
logging (tests/integrations/test_vllm_logging.py reads vLLM's source to check that order):
- serving process (``vllm serve``'s API server; ``LLM(...)``'s process): plugins are loaded while
  the arguments are built, then ``configure_logging`` (twice: vLLM re-applies it when it creates
  the engine config; the second must not repeat the line);
- engine core (``EngineCoreProc.run_engine_core``): ``configure_logging``, then
  ``EngineCore.__init__`` loads plugins; it starts the workers;
- worker (``WorkerProc.worker_main``): ``configure_logging``, then
  ``WorkerWrapperBase.init_worker`` loads plugins.
Processes start through vLLM's ``get_mp_context()`` (``VLLM_WORKER_MULTIPROC_METHOD``). The
model, the engine and the kernels are left out: what is exercised is plugin loading and logging.

Run: ``python -m helpers.vllm_processes WORKERS``; every process prints its log to stderr."""
import sys
import types

import vllm.logger
import vllm.plugins
from vllm.utils.system_utils import get_mp_context

# vllm.config.LoggingConfig's fields that vllm.logger reads (importing vllm.config needs
# transformers); values are LoggingConfig()'s defaults.
CONFIG = types.SimpleNamespace(configure_logging=True, log_level="INFO", pylogging_config_file=None,
                               formatter="text")


def worker_main(rank: int) -> None:
    vllm.logger.set_vllm_process_name(f"Worker_TP{rank}")
    vllm.logger.configure_logging(CONFIG)
    vllm.plugins.load_general_plugins()


def run_engine_core(workers: int) -> None:
    vllm.logger.set_vllm_process_name("EngineCore")
    vllm.logger.configure_logging(CONFIG)
    vllm.plugins.load_general_plugins()
    context = get_mp_context()
    procs = [context.Process(target=worker_main, args=(rank,)) for rank in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
        assert p.exitcode == 0, p.exitcode


def serve(workers: int) -> None:
    vllm.logger.set_vllm_process_name("APIServer")
    vllm.plugins.load_general_plugins()
    vllm.logger.configure_logging(CONFIG)
    vllm.logger.configure_logging(CONFIG)
    core = get_mp_context().Process(target=run_engine_core, args=(workers,))
    core.start()
    core.join()
    assert core.exitcode == 0, core.exitcode


if __name__ == "__main__":
    serve(int(sys.argv[1]))
