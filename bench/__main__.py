import sys

from bench import launcher

launcher.start()  # before any heavy import: measured processes are forked from this small process

from bench.main import main  # noqa: E402

try:
    code = main()
finally:
    launcher.get().close()
sys.exit(code)
