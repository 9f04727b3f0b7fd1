#!/usr/bin/env python3
"""Renders the golden chat strings the Go tests compare against.

Run from internal/tokenizer/testdata: python3 chat/render.py
It renders every template of templates/ on every conversation of
chat/cases.json with jinja2 configured as transformers configures it
(ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols,
its tojson, raise_exception and strftime_now), strftime_now reading the
fixed date of cases.json, and writes chat/<template>.<case>.txt. A case the
template refuses (raise_exception) is written as <template>.<case>.error.
It also renders the feature snippets of chat/snippets.json into
chat/snippet.<name>.txt.
"""
import datetime
import json
import os

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

here = os.path.dirname(os.path.abspath(__file__))
cases = json.load(open(os.path.join(here, "cases.json"), encoding="utf-8"))
now = datetime.datetime.fromisoformat(cases["now"])


def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(fmt):
    return now.strftime(fmt)


env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = strftime_now

for snip in json.load(open(os.path.join(here, "snippets.json"), encoding="utf-8")):
    text = env.from_string(snip["template"]).render(**snip["vars"])
    open(os.path.join(here, f"snippet.{snip['name']}.txt"), "w", encoding="utf-8", newline="").write(text)

for name, spec in cases["templates"].items():
    src = open(os.path.join(here, "..", "templates", spec["file"]), encoding="utf-8").read()
    tmpl = env.from_string(src)
    for case in cases["conversations"]:
        out = os.path.join(here, f"{name}.{case['name']}")
        for stale in (out + ".txt", out + ".error"):
            if os.path.exists(stale):
                os.remove(stale)
        try:
            text = tmpl.render(messages=case["messages"], add_generation_prompt=case["add_generation_prompt"],
                               **spec.get("special_tokens", {}), **case.get("kwargs", {}))
        except jinja2.exceptions.TemplateError as e:
            open(out + ".error", "w", encoding="utf-8").write(str(e) + "\n")
            continue
        open(out + ".txt", "w", encoding="utf-8", newline="").write(text)
