# The reference peer of tests/text/chat_exactness_test.cc: renders a chat template with Python's
# Jinja2 in the environment transformers' apply_chat_template compiles it in
# (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, the loopcontrols extension, a
# {% generation %} tag, and its own tojson, raise_exception and strftime_now), over each set of
# variables of a JSON file. Prints one JSON string per set: the rendering, or {"error": message}
# when the template raised.
#   python3 py_render.py CASES_JSON
# CASES_JSON: {"template": "...", "cases": [{"messages": [...], "add_generation_prompt": ..., ...}]}
#         or: {"snippets": [{"template": "...", "variables": {...}}, ...]}
import json
import sys
from datetime import datetime

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment


class Generation(Extension):
    # transformers' AssistantTracker without the tracking: the body renders as it is.
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def strftime_now(format):
    return datetime.now().strftime(format)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                    extensions=[Generation, loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = strftime_now

with open(sys.argv[1], encoding="utf-8") as f:
    data = json.load(f)
# One template over many variable sets, or (with "snippets") many small templates, each with its
# own variables.
if "snippets" in data:
    jobs = [(s["template"], s.get("variables", {})) for s in data["snippets"]]
else:
    jobs = [(data["template"], v) for v in data["cases"]]
compiled = {}
out = []
for source, variables in jobs:
    try:
        if source not in compiled:
            compiled[source] = env.from_string(source)
        out.append(json.dumps(compiled[source].render(**variables), ensure_ascii=False))
    except jinja2.exceptions.TemplateError as e:
        out.append(json.dumps({"error": str(e)}))
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, ZeroDivisionError) as e:
        out.append(json.dumps({"error": type(e).__name__ + ": " + str(e)}))
sys.stdout.write("\n".join(out) + "\n")
