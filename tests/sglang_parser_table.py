"""SGLang's own argument parser, read from an installed build (runs under the Python that has sglang).

Standalone: it imports sglang, not this package.
  table  print the parser as JSON (what provision/data/sglang_parsers.yml holds for the release)
  yaml   print the same as the YAML block of sglang_parsers.yml (to regenerate the file)
  serve  read one JSON argv per line, answer {"ok", "set", "error"}: the destinations the parser
         sets and their values (not converted or checked: the grammar is what is compared)
"""

import argparse
import importlib.metadata
import json
import re
import sys

# A destination that holds a credential: named so (api keys, passwords, secrets), or one SGLang
# itself redacts from logs and /server_info (its watermark key fields).
CREDENTIAL = re.compile(r"(^|_)(api_key|password|passwd|secret|credentials?)(_|$)")


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise _Refused(message)


def parser():
    from sglang.srt.server_args import ServerArgs

    built = _Parser(prog="sglang.launch_server")
    ServerArgs.add_cli_args(built)
    return built


def secret_dests():
    from sglang.srt.sampling.watermarking.core import WATERMARK_SECRET_FIELD_NAMES

    return set(WATERMARK_SECRET_FIELD_NAMES)


def table():
    built, redacted = parser(), secret_dests()
    choices = {a.dest: list(a.choices) for a in built._actions if a.choices}
    options = []
    for action in built._actions:
        nargs = 1 if action.nargs is None else action.nargs
        entry = {"names": list(action.option_strings), "dest": action.dest, "nargs": nargs}
        if CREDENTIAL.search(action.dest) or action.dest in redacted:
            entry["secret"] = True
        options.append(entry)
    return {
        "release": importlib.metadata.version("sglang"),
        "reasoning_parsers": choices["reasoning_parser"],
        "tool_call_parsers": choices["tool_call_parser"],
        "options": options,
    }


def yaml_block(data):
    def flow(items):
        return "[" + ", ".join(json.dumps(i) for i in items) + "]"

    lines = [
        f'"{data["release"]}":',
        f"  reasoning_parsers: {flow(data['reasoning_parsers'])}",
        f"  tool_call_parsers: {flow(data['tool_call_parsers'])}",
        "  options:",
    ]
    for o in data["options"]:
        secret = ", secret: true" if o.get("secret") else ""
        lines.append(f"    - {{dest: {o['dest']}, nargs: {json.dumps(o['nargs'])}{secret}, names: {flow(o['names'])}}}")
    return "\n".join(lines)


def serve():
    built = parser()
    built.print_help = lambda file=None: None  # keep stdout for the answers
    unset = object()
    for action in built._actions:
        action.type, action.choices = None, None
        if action.default is not argparse.SUPPRESS:
            action.default = unset
    for line in sys.stdin:
        try:
            namespace = built.parse_args(json.loads(line))
        except _Refused as err:
            answer = {"ok": False, "set": {}, "error": str(err)}
        except SystemExit:  # -h prints the help and exits
            answer = {"ok": False, "set": {}, "error": "exit"}
        else:
            chosen = {k: v for k, v in vars(namespace).items() if v is not unset}
            answer = {"ok": True, "set": chosen, "error": None}
        print(json.dumps(answer, default=str), flush=True)


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "table":
        print(json.dumps(table()))
    elif mode == "yaml":
        print(yaml_block(table()))
    else:
        serve()
