"""Ask an installed SGLang build's own parser whether it accepts a server command line.

Standalone on purpose: it runs under the Python that has SGLang installed (a host's venv), which
does not have this package. Usage: python sglang_argcheck.py '["--model-path", "/m", ...]'
Prints {"ok": true} or {"ok": false, "error": "..."}; exit 0 when accepted, 1 when refused.
"""

import argparse
import json
import sys


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise _Refused(message)


def check(args):
    from sglang.srt.server_args import ServerArgs

    parser = _Parser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(parser)
    try:
        parser.parse_args(args)
    except _Refused as err:
        return {"ok": False, "error": str(err)}
    return {"ok": True}


if __name__ == "__main__":
    result = check(json.loads(sys.argv[1]))
    print(json.dumps(result))
    sys.exit(0 if result["ok"] else 1)
