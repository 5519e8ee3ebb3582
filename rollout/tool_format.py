"""The text side of multi-turn tool use: how tools are announced, how the model's tool calls are parsed, and the text
of tool results, in two formats behind one interface (`tool_format(name, tokenizer)`):

- `hermes`: Hermes-style calls as Qwen3 (and the embedded tokenizer) use them,
  `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` after the answer text, results in `tool`-role
  messages that Qwen3's template renders as one user turn of `<tool_response>\\n...\\n</tool_response>` blocks.
  Every text is rendered by the tokenizer's own chat template, so it is exactly what the template renders for the
  same conversation. Templates without tool support get the tools as a system text and the results wrapped in
  `<tool_response>` by us (in a `tool` message, or a user one where the template rejects the `tool` role).
- `dsml`: DeepSeek-V3.2's DSML markup (its released encoder, `encoding_dsv32.py`): tools as JSON schemas in the
  system prompt, calls as a `<｜DSML｜function_calls>` block of `<｜DSML｜invoke name="...">` elements with
  `<｜DSML｜parameter name="..." string="true|false">` children, results as `<function_results>` of `<result>`s that
  follow the turn's end token directly (V3.2 opens no new assistant header after tool results).

Token-in/token-out contract (rollout/agent.py): the model's generated ids are appended verbatim and a turn ends with
the format's `end_token` (`<|im_end|>` for ChatML models, `<｜end▁of▁sentence｜>` for V3.2; `stop_ids` are its id and
the tokenizer's EOS). `tool_results_text` is the text appended after such a turn: it closes nothing already generated,
adds the results and opens the next assistant turn (with the thinking mode's prefill, see rollout/thinking.py); the
loop tokenizes only that text. Results go in ONE call per turn: a malformed call's error is a `(None, message)` entry
beside the real results (`error_text(errors)` is the same for a turn with errors only); two texts must not be
concatenated, since each opens an assistant turn. Special-token strings in result contents are escaped (a zero-width
space after their first character) so that they are tokenized as plain text.

Thinking mode: a format is built for one mode (`thinking=`); `initial_prompt(..., thinking=...)` sets it for the
calls that follow, so a loop that passes its mode there gets matching result texts.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from rollout.thinking import (
    THINK_CLOSE, THINK_OPEN, USER_ROLES, assistant_prefill, keep_reasoning, last_user_index, split_reasoning,
)

ZWSP = "\u200b"  # inserted after the first character of a special-token string found in a tool result
SNIPPET = 200  # characters of a malformed call quoted back to the model
MAX_ERRORS = 8  # malformed calls described per turn; the rest are counted in one more line
FORMATS = ("hermes", "dsml", "auto")


@dataclass
class ToolCall:
    name: str
    arguments: dict


@dataclass
class ParsedTurn:
    content: str  # the answer text without reasoning and tool-call markup (stripped)
    reasoning: str | None  # the <think>...</think> part, if any
    tool_calls: list[ToolCall] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # malformed calls, each described for the model

    def to_message(self) -> dict:
        """The turn as an assistant chat message (OpenAI-style tool calls), e.g. for rollout/thinking.py."""
        msg = {"role": "assistant", "content": self.content}
        if self.reasoning is not None:
            msg["reasoning_content"] = self.reasoning
        if self.tool_calls:
            msg["tool_calls"] = [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                                 for c in self.tool_calls]
        return msg


# -- shared helpers ------------------------------------------------------------------------------------------------
def function_schemas(tools: list[dict]) -> list[dict]:
    """Tools as plain function schemas ({"name", "description", "parameters"}); OpenAI-style
    {"type": "function", "function": {...}} entries are unwrapped."""
    return [t["function"] if isinstance(t.get("function"), dict) else t for t in tools or []]


def openai_tools(tools: list[dict]) -> list[dict]:
    """Tools in OpenAI's {"type": "function", "function": {...}} form (what Qwen3's template renders)."""
    return [{"type": "function", "function": f} for f in function_schemas(tools)]


def _json_type(value) -> str:
    kinds = {bool: "boolean", int: "number", float: "number", str: "string", list: "array", dict: "object"}
    return kinds.get(type(value), "null")


def _snippet(text: str) -> str:
    text = text.strip()
    return text if len(text) <= SNIPPET else text[: SNIPPET // 2] + " ... " + text[-SNIPPET // 2:]


def markup_tokens(tokenizer) -> set[str]:
    """The tokenizer's strings that tokenize to special or markup ids: its special tokens and every added token that
    looks like markup (`<...>` / `[...]`, e.g. Qwen3's non-special `<tool_call>`)."""
    if tokenizer is None:
        return set()
    out = set(getattr(tokenizer, "all_special_tokens", []) or [])
    for tok in (tokenizer.get_added_vocab() if hasattr(tokenizer, "get_added_vocab") else {}):
        if len(tok) >= 2 and tok[0] in "<[" and tok[-1] in ">]":
            out.add(tok)
    return out


class Escaper:
    """Breaks every occurrence of the given strings by a zero-width space after its first character. Repeats until
    none is left (a string hidden inside a longer one is caught on the next pass); each pass is linear."""

    def __init__(self, strings):
        strings = sorted({s for s in strings if s and len(s) >= 2 and ZWSP not in s}, key=len, reverse=True)
        self._re = re.compile("|".join(map(re.escape, strings))) if strings else None

    def __call__(self, text: str) -> str:
        if self._re is None:
            return text
        while self._re.search(text):
            text = self._re.sub(lambda m: m.group()[0] + ZWSP + m.group()[1:], text)
        return text


class _Errors(list):
    """The errors of one turn: at most MAX_ERRORS described (a message is built only when it will be kept), the
    rest counted, so a turn of a million broken calls costs linear time and little memory."""

    dropped = 0

    def add(self, make) -> None:
        if len(self) < MAX_ERRORS:
            self.append(make())
        else:
            self.dropped += 1

    def done(self) -> list[str]:
        return list(self) + ([f"... and {self.dropped} more malformed tool calls."] if self.dropped else [])


def _result_text(content) -> str:
    return content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)


class ToolFormat:
    """One tool-call format (see the module docstring). Subclasses set `name`, `style` (rollout.thinking),
    `end_token`, `stop_ids` and implement the rendering and parsing."""

    name = ""
    style = ""

    def __init__(self, tokenizer, *, thinking: bool = False):
        self.tok = tokenizer
        self.thinking = bool(thinking)
        self.end_token = ""
        self.stop_ids: list[int] = []
        self.escape = Escaper(())

    def _stop_ids(self) -> list[int]:
        """Ids that end a turn: the end token's (when it is one token) and the tokenizer's EOS."""
        ids = []
        vocab = self.tok.get_vocab() if self.tok is not None else {}
        for tok in (self.end_token, getattr(self.tok, "eos_token", None)):
            if tok and tok in vocab and vocab[tok] not in ids:
                ids.append(vocab[tok])
        return ids

    def _mode(self, thinking: bool | None) -> bool:
        return self.thinking if thinking is None else bool(thinking)

    def _set_mode(self, thinking: bool | None) -> None:
        if thinking is not None:  # initial_prompt's mode holds for the episode's later texts
            self.thinking = bool(thinking)

    def _strip_end(self, text: str) -> str:
        for tok in (self.end_token, getattr(self.tok, "eos_token", None)):
            if tok and text.endswith(tok):
                text = text[: -len(tok)]
        return text

    def system_prompt(self, tools: list[dict], base: str | None = None) -> list[dict] | str:
        raise NotImplementedError

    def initial_prompt(self, messages: list[dict], tools: list[dict], *, thinking: bool | None = None) -> str:
        raise NotImplementedError

    def parse(self, text: str) -> ParsedTurn:
        raise NotImplementedError

    def tool_results_text(self, results: list[tuple[ToolCall | None, str]], *, thinking: bool | None = None) -> str:
        raise NotImplementedError

    def error_text(self, errors: list[str], *, thinking: bool | None = None) -> str:
        """The text for a turn whose calls were all malformed (or that called no tool): each error as a tool
        result. Mixed with real results, pass `(None, error)` entries to `tool_results_text` instead."""
        return self.tool_results_text([(None, e) for e in errors], thinking=thinking)

    def call_text(self, calls: list[tuple[str, dict]]) -> str:
        """An assistant turn that only calls these tools, as the model is asked to write it (before the end token);
        `parse` reads it back as the same calls. For in-context demonstrations (`agent.demo`)."""
        raise NotImplementedError

    def user_text(self, content: str) -> str:
        """What follows an assistant turn's end token when a new user message arrives: that message and the next
        assistant header with the mode's prefill."""
        raise NotImplementedError


# -- hermes ----------------------------------------------------------------------------------------------------------
HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<tool_response>", "</tool_response>"
_HERMES_TAG = re.compile(r"</?tool_call>")
HERMES_MARKUP = {HERMES_OPEN, HERMES_CLOSE, RESPONSE_OPEN, RESPONSE_CLOSE, THINK_OPEN, THINK_CLOSE, "<tools>",
                 "</tools>", "<|im_start|>", "<|im_end|>", "<|endoftext|>"}
HERMES_HOWTO = ('Write each call as <tool_call>\n{"name": <tool name>, "arguments": <arguments as a JSON object>}\n'
                '</tool_call>.')
HERMES_TOOLS_TEXT = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> "
    "XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call>\n\n"
    "Each result comes back within <tool_response></tool_response> XML tags."
)
_SENTINEL = "MIXRLSENTINELQZX"  # a string no template changes, to cut a rendering at the end of a turn
_PROBE_TOOL = "mixrl_probe_tool_qzx"


def _decode_hermes(payload: str) -> tuple[ToolCall | None, str | None]:
    body = payload.strip()
    if not body:
        return None, "is empty"
    try:
        obj = json.loads(body)
    except RecursionError:
        return None, "is not valid JSON (nested too deeply)"
    except ValueError as exc:  # JSONDecodeError, or a number too long to convert
        where = f" at line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
        return None, f"is not valid JSON ({getattr(exc, 'msg', str(exc))}{where})"
    if not isinstance(obj, dict):
        return None, f'must be a JSON object with "name" and "arguments", not a JSON {_json_type(obj)}'
    name = obj.get("name")
    if not isinstance(name, str) or not name.strip():
        return None, 'has no "name" (the tool\'s name, a non-empty string)'
    args = obj.get("arguments", {})
    if isinstance(args, str):  # arguments given as a JSON string: accepted when it holds an object
        try:
            args = json.loads(args) if args.strip() else {}
        except (ValueError, RecursionError):
            return None, f'has "arguments" that is a string but not a JSON object (tool {name!r})'
    args = {} if args is None else args
    if not isinstance(args, dict):
        return None, f'has "arguments" that must be a JSON object, not a JSON {_json_type(args)} (tool {name!r})'
    return ToolCall(name.strip(), args), None


class HermesFormat(ToolFormat):
    name = "hermes"
    style = "chatml"

    def __init__(self, tokenizer, *, thinking: bool = False):
        super().__init__(tokenizer, thinking=thinking)
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("tool format hermes needs a tokenizer with a chat template")
        self.native_tools = self._supports_tools()
        self.end_token = self._find_end_token()
        self.tool_role, self.wrap_results = self._tool_rendering()
        self.stop_ids = self._stop_ids()
        self.escape = Escaper(markup_tokens(tokenizer) | HERMES_MARKUP)

    # -- the template, probed once ------------------------------------------------------------------------------
    def _render(self, messages: list[dict], **kwargs) -> str:
        return self.tok.apply_chat_template(messages, tokenize=False, **kwargs)

    def _supports_tools(self) -> bool:
        probe = [{"type": "function", "function": {"name": _PROBE_TOOL, "description": "probe",
                                                   "parameters": {"type": "object", "properties": {}}}}]
        try:
            return _PROBE_TOOL in self._render([{"role": "user", "content": "x"}], tools=probe)
        except Exception:  # noqa: BLE001 - a template that fails on tools= does not support them
            return False

    def _find_end_token(self) -> str:
        """The special token the template closes an assistant turn with (the first one after its content)."""
        text = self._render([{"role": "user", "content": "x"}, {"role": "assistant", "content": _SENTINEL}])
        tail = text[text.index(_SENTINEL) + len(_SENTINEL):]
        found = [(tail.find(t), -len(t), t) for t in markup_tokens(self.tok) if t in tail]
        if not found:
            raise ValueError("tool format hermes: the chat template closes an assistant turn with no special token")
        return min(found)[2]

    def _dummy_turn(self, n_calls: int) -> list[dict]:
        calls = [{"type": "function", "function": {"name": _PROBE_TOOL, "arguments": {}}}] * max(1, n_calls)
        return [{"role": "user", "content": "x"}, {"role": "assistant", "content": _SENTINEL, "tool_calls": calls}]

    def _tool_rendering(self) -> tuple[str, bool]:
        """(role of tool results, whether we wrap them in <tool_response> ourselves)."""
        try:
            text = self._render(self._dummy_turn(1) + [{"role": "tool", "content": _SENTINEL + "T"}],
                                add_generation_prompt=True)
        except Exception:  # noqa: BLE001 - the template rejects the tool role: results go in a user message
            return "user", True
        after = text[text.index(_SENTINEL) + len(_SENTINEL):]
        at = after.find(_SENTINEL + "T")  # -1: the template drops tool messages
        return ("user", True) if at == -1 else ("tool", RESPONSE_OPEN not in after[:at])

    # -- the interface --------------------------------------------------------------------------------------------
    def system_prompt(self, tools: list[dict], base: str | None = None) -> list[dict] | str:
        """Native tool support: the system message(s) to render with `tools=openai_tools(tools)`. Otherwise the
        system text that lists the tools' JSON schemas (base first)."""
        if self.native_tools:
            return [{"role": "system", "content": base}] if base else []
        listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in openai_tools(tools))
        text = HERMES_TOOLS_TEXT.format(tools=listed)
        return f"{base}\n\n{text}" if base else text

    def initial_prompt(self, messages: list[dict], tools: list[dict], *, thinking: bool | None = None) -> str:
        """The first prompt (system + user messages), ending with the assistant header and the mode's prefill.
        A `thinking` given here becomes the format's mode for the following calls."""
        self._set_mode(thinking)
        messages = [dict(m) for m in messages]
        base = messages.pop(0)["content"] if messages and messages[0].get("role") == "system" else None
        kwargs = {"add_generation_prompt": True, "enable_thinking": self.thinking}
        if not tools:
            head = [{"role": "system", "content": base}] if base else []
            return self._render(head + messages, **kwargs)
        system = self.system_prompt(tools, base)
        if self.native_tools:
            return self._render(system + messages, tools=openai_tools(tools), **kwargs)
        return self._render([{"role": "system", "content": system}] + messages, **kwargs)

    def parse(self, text: str) -> ParsedTurn:
        """Tool calls are read from the text after the reasoning only; each malformed one (bad JSON, no name,
        arguments not an object, never closed, a stray closing tag) becomes an error. Linear in the text."""
        reasoning, body = split_reasoning(self._strip_end(text))
        calls, errors, pieces = [], _Errors(), []
        pos, open_at, n = 0, None, 0
        for m in _HERMES_TAG.finditer(body):
            if m.group() == HERMES_OPEN:
                if open_at is not None:
                    n += 1
                    errors.add(lambda: f"Tool call {n} was not closed with </tool_call> before the next <tool_call>: "
                                       f"{_snippet(body[open_at:m.start()])!r}. {HERMES_HOWTO}")
                else:
                    pieces.append(body[pos:m.start()])
                open_at = m.end()
            elif open_at is None:
                errors.add(lambda: f"A </tool_call> closes no <tool_call>. {HERMES_HOWTO}")
                pieces.append(body[pos:m.start()])
                pos = m.end()
            else:
                n += 1
                call, err = _decode_hermes(body[open_at:m.start()])
                if call is not None:
                    calls.append(call)
                else:
                    errors.add(lambda: f"Tool call {n} {err}: {_snippet(body[open_at:m.start()])!r}. {HERMES_HOWTO}")
                open_at, pos = None, m.end()
        if open_at is not None:
            n += 1
            errors.add(lambda: f"Tool call {n} was not closed with </tool_call>: {_snippet(body[open_at:])!r}. "
                               f"{HERMES_HOWTO}")
        else:
            pieces.append(body[pos:])
        return ParsedTurn("".join(pieces).strip(), reasoning, calls, errors.done())

    def tool_results_text(self, results: list[tuple[ToolCall | None, str]], *, thinking: bool | None = None) -> str:
        """What the template renders after the turn's end token for these tool messages, up to and including the
        next assistant header (and the mode's prefill)."""
        if not results:
            raise ValueError("tool_results_text needs at least one result")
        contents = [self.escape(_result_text(content)) for _, content in results]
        if self.wrap_results:
            contents = [f"{RESPONSE_OPEN}\n{c}\n{RESPONSE_CLOSE}" for c in contents]
        if self.tool_role == "tool":
            tool_msgs = [{"role": "tool", "content": c} for c in contents]
        else:
            tool_msgs = [{"role": "user", "content": "\n".join(contents)}]
        text = self._render(self._dummy_turn(len(results)) + tool_msgs, add_generation_prompt=True,
                            enable_thinking=self._mode(thinking))
        end = text.index(self.end_token, text.index(_SENTINEL) + len(_SENTINEL))
        return text[end + len(self.end_token):]

    def call_text(self, calls: list[tuple[str, dict]]) -> str:
        return "\n".join(f"{HERMES_OPEN}\n{json.dumps({'name': n, 'arguments': a}, ensure_ascii=False)}\n{HERMES_CLOSE}"
                         for n, a in calls)

    def user_text(self, content: str) -> str:
        text = self._render([{"role": "user", "content": "x"}, {"role": "assistant", "content": _SENTINEL},
                             {"role": "user", "content": content}], add_generation_prompt=True,
                            enable_thinking=self.thinking)
        end = text.index(self.end_token, text.index(_SENTINEL) + len(_SENTINEL))
        return text[end + len(self.end_token):]


# -- dsml (DeepSeek-V3.2) --------------------------------------------------------------------------------------------
DSML = "｜DSML｜"
BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
USER, ASSISTANT = "<｜User｜>", "<｜Assistant｜>"
CALLS_OPEN, CALLS_CLOSE = f"<{DSML}function_calls>", f"</{DSML}function_calls>"
_DSML_TAG = re.compile(f"<(/?){DSML}(function_calls|invoke|parameter)([^<>]*)>")
_INVOKE_ATTRS = re.compile(r'\s*name="([^"]+)"\s*')
_PARAM_ATTRS = re.compile(r'\s*name="([^"]+)"\s+string="(true|false)"\s*')
# Strings broken in tool results: every DeepSeek special token has the form <｜...｜> (so "<｜" and "</｜" catch
# them all, DSML tags included), plus the result and reasoning markup.
DSML_MARKUP = {"<｜", "</｜", "<function_results>", "</function_results>", "<result>", "</result>", THINK_OPEN,
               THINK_CLOSE}
DSML_TOOLS_TEXT = (
    "## Tools\nYou have access to a set of tools you can use to answer the user's question.\n"
    "You can invoke functions by writing a \"<{d}function_calls>\" block like the following as part of your reply "
    "to the user:\n<{d}function_calls>\n<{d}invoke name=\"$FUNCTION_NAME\">\n"
    "<{d}parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</{d}parameter>\n...\n"
    "</{d}invoke>\n<{d}invoke name=\"$FUNCTION_NAME2\">\n...\n</{d}invoke>\n</{d}function_calls>\n"
    "String and scalar parameters should be specified as is without any escaping or quotes, while lists and objects "
    "should use JSON format. The \"string\" attribute should be set to \"true\" for string type parameters and "
    "\"false\" for other types (numbers, booleans, arrays, objects).\n"
    "If the thinking_mode is enabled, then after function results you should strongly consider outputting a "
    "thinking block. Here is an example:\n<{d}function_calls>\n...\n</{d}function_calls>\n<function_results>\n...\n"
    "</function_results>\n{think_open}...thinking about results{think_close}\n"
    "Here are the functions available in JSONSchema format:\n<functions>\n{schemas}\n</functions>\n"
)
DSML_HOWTO = (f'Write calls as {CALLS_OPEN}\n<{DSML}invoke name="TOOL">\n<{DSML}parameter name="NAME" '
              f'string="true|false">VALUE</{DSML}parameter>\n</{DSML}invoke>\n{CALLS_CLOSE}.')


def dsml_invoke(name: str, arguments: dict | str) -> str:
    """One call in DSML, as V3.2's encoder writes it (strings as they are, other values as JSON)."""
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    params = "\n".join(
        f'<{DSML}parameter name="{k}" string="{"true" if isinstance(v, str) else "false"}">'
        f'{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}</{DSML}parameter>'
        for k, v in args.items())
    return f'<{DSML}invoke name="{name}">\n{params}\n</{DSML}invoke>'


def dsml_calls(calls: list[dict]) -> str:
    """An assistant message's tool calls (OpenAI-style or {"name", "arguments"}) as the block after its content."""
    fns = [c["function"] if isinstance(c.get("function"), dict) else c for c in calls]
    return "\n\n" + CALLS_OPEN + "\n" + "\n".join(dsml_invoke(f["name"], f["arguments"]) for f in fns) + \
        "\n" + CALLS_CLOSE


class _Invoke:
    def __init__(self, name: str | None, problem: str | None):
        self.name, self.args, self.problems = name, {}, []
        self.problem(problem)

    def problem(self, text: str | None) -> None:
        if text and len(self.problems) < 4:
            self.problems.append(text)

    def value(self, name: str, string: str, raw: str) -> None:
        if name in self.args:
            return self.problem(f"parameter {name!r} is given twice")
        if string == "true":
            self.args[name] = raw
            return None
        try:
            self.args[name] = json.loads(raw)
        except (ValueError, RecursionError):
            self.problem(f'parameter {name!r} has string="false" but its value is not JSON: {_snippet(raw)!r}')


def _parse_dsml(body: str) -> tuple[str, list[ToolCall], list[str]]:
    """(content, calls, errors) of a turn's text after its reasoning: one pass over the DSML tags."""
    calls, errors, pieces = [], _Errors(), []
    state, pos, value_at, param, cur, n = "content", 0, 0, ("", "true"), None, 0

    def finish(problem: str | None = None):
        nonlocal cur, n
        n += 1
        cur.problem(problem)
        if cur.problems:
            named = f" ({cur.name})" if cur.name else ""
            errors.add(lambda: f"Tool call {n}{named}: " + "; ".join(cur.problems) + f". {DSML_HOWTO}")
        else:
            calls.append(ToolCall(cur.name, cur.args))
        cur = None

    for m in _DSML_TAG.finditer(body):
        closing, kind, attrs = m.group(1) == "/", m.group(2), m.group(3)
        if state == "param":  # everything up to </parameter> is the value
            if kind == "parameter" and closing:
                cur.value(*param, body[value_at:m.start()])
                state, pos = "invoke", m.end()
            continue
        between, pos = body[pos:m.start()], m.end()
        if state == "content":
            pieces.append(between)
            if kind == "function_calls" and not closing:
                state = "calls"
            else:
                errors.add(lambda: f"{m.group()} outside a {CALLS_OPEN} block. {DSML_HOWTO}")
            continue
        if between.strip():
            if cur is not None:
                cur.problem(f"unexpected text {_snippet(between)!r}")
            else:
                errors.add(lambda: f"Unexpected text {_snippet(between)!r} inside {CALLS_OPEN}. {DSML_HOWTO}")
        if kind == "invoke" and not closing:
            if cur is not None:
                finish(f"not closed with </{DSML}invoke>")
            named = _INVOKE_ATTRS.fullmatch(attrs)
            cur = _Invoke(named and named.group(1), None if named else f"no name=\"...\" in {_snippet(m.group())!r}")
            state = "invoke"
        elif kind == "invoke" and cur is not None:
            finish()
            state = "calls"
        elif kind == "parameter" and not closing and cur is not None:
            attr = _PARAM_ATTRS.fullmatch(attrs)
            if attr is None:
                cur.problem(f'bad parameter tag {_snippet(m.group())!r} (it needs name="..." string="true|false")')
            param = (attr.group(1), attr.group(2)) if attr else (f"#{len(cur.args)}", "true")
            value_at, state = m.end(), "param"
        elif kind == "function_calls" and closing:
            if cur is not None:
                finish(f"not closed with </{DSML}invoke>")
            state = "content"
        else:
            errors.add(lambda: f"Unexpected {m.group()} inside {CALLS_OPEN}. {DSML_HOWTO}")
    if state == "content":
        pieces.append(body[pos:])
    else:
        if state == "param":
            cur.problem(f"parameter {param[0]!r} is not closed with </{DSML}parameter>")
        if cur is not None:
            finish(f"not closed with </{DSML}invoke>")
        errors.add(lambda: f"The {CALLS_OPEN} block is not closed with {CALLS_CLOSE}. {DSML_HOWTO}")
    return "".join(pieces).strip(), calls, errors.done()


class DsmlFormat(ToolFormat):
    name = "dsml"
    style = "dsml"

    def __init__(self, tokenizer=None, *, thinking: bool = False):
        super().__init__(tokenizer, thinking=thinking)
        self.end_token = EOS
        self.stop_ids = self._stop_ids()
        self.escape = Escaper(markup_tokens(tokenizer) | DSML_MARKUP)

    def system_prompt(self, tools: list[dict], base: str | None = None) -> list[dict] | str:
        schemas = "\n".join(json.dumps(f, ensure_ascii=False) for f in function_schemas(tools))
        text = DSML_TOOLS_TEXT.format(d=DSML, think_open=THINK_OPEN, think_close=THINK_CLOSE, schemas=schemas)
        return f"{base or ''}\n\n{text}"

    def render_messages(self, messages: list[dict], tools: list[dict] | None = None, *,
                        thinking: bool | None = None, add_bos: bool = True) -> str:
        """A whole conversation as V3.2's encoder renders it (system, user, assistant with reasoning and tool calls,
        tool results), with its thinking-context rule: reasoning before the last user message is dropped. The tools
        go into the first system message (one is added when there is none)."""
        thinking = self._mode(thinking)
        messages = [dict(m) for m in messages]
        if tools:
            if not messages or messages[0].get("role") != "system":
                messages.insert(0, {"role": "system", "content": ""})
            messages[0]["content"] = self.system_prompt(tools, messages[0].get("content"))
        if thinking:
            messages = keep_reasoning(messages)
        last_user = last_user_index(messages)
        out = [BOS] if add_bos else []
        for i, m in enumerate(messages):
            role, content = m.get("role"), m.get("content") or ""
            if role == "system":
                out.append(content)
            elif role in USER_ROLES:
                out.append(f"{USER}{content}{ASSISTANT}" + assistant_prefill("dsml", thinking and i == last_user))
            elif role == "assistant":
                if thinking and i > last_user:
                    out.append((m.get("reasoning_content") or m.get("reasoning") or "") + THINK_CLOSE)
                out.append(content + (dsml_calls(m["tool_calls"]) if m.get("tool_calls") else "") + EOS)
            elif role == "tool":
                if i == 0 or messages[i - 1].get("role") != "tool":
                    out.append("\n\n<function_results>")
                out.append(f"\n<result>{content}</result>")
                if i + 1 == len(messages) or messages[i + 1].get("role") != "tool":
                    out.append("\n</function_results>\n\n" + assistant_prefill("dsml", thinking and i >= last_user))
            else:
                raise ValueError(f"dsml: unknown role {role!r}")
        return "".join(out)

    def initial_prompt(self, messages: list[dict], tools: list[dict], *, thinking: bool | None = None) -> str:
        """BOS, the system prompt with the tools, the user turn(s) and `<｜Assistant｜>` with the mode's prefill
        (`<think>` or `</think>`). A `thinking` given here becomes the format's mode for the following calls."""
        self._set_mode(thinking)
        return self.render_messages(messages, tools)

    def tool_results_text(self, results: list[tuple[ToolCall | None, str]], *, thinking: bool | None = None) -> str:
        """`\\n\\n<function_results>\\n<result>...</result>...\\n</function_results>\\n\\n` and the prefill of the
        next assistant turn (`<think>` in thinking mode, `</think>` otherwise), right after the turn's EOS."""
        if not results:
            raise ValueError("tool_results_text needs at least one result")
        body = "".join(f"\n<result>{self.escape(_result_text(c))}</result>" for _, c in results)
        return (f"\n\n<function_results>{body}\n</function_results>\n\n"
                + assistant_prefill("dsml", self._mode(thinking)))

    def call_text(self, calls: list[tuple[str, dict]]) -> str:
        return dsml_calls([{"name": n, "arguments": a} for n, a in calls])

    def user_text(self, content: str) -> str:
        return f"{USER}{content}{ASSISTANT}" + assistant_prefill("dsml", self.thinking)

    def parse(self, text: str) -> ParsedTurn:
        """Calls are read from the text after the reasoning: every `<｜DSML｜function_calls>` block, each
        `<｜DSML｜invoke>` with its parameters (string="true": the value as it is; "false": JSON). A malformed
        invoke (no name, bad parameter tag, bad JSON value, a duplicate parameter, never closed) or block becomes an
        error; well-formed invokes of the same turn are still called. Linear in the text."""
        reasoning, body = split_reasoning(self._strip_end(text))
        content, calls, errors = _parse_dsml(body)
        return ParsedTurn(content, reasoning, calls, errors)


# -- choosing one ----------------------------------------------------------------------------------------------------
def detect_format(tokenizer) -> str:
    """`auto`: dsml for DeepSeek tokenizers (they have `<｜User｜>` / `<｜Assistant｜>`), hermes otherwise."""
    added = tokenizer.get_added_vocab() if hasattr(tokenizer, "get_added_vocab") else {}
    return "dsml" if USER in added or ASSISTANT in added else "hermes"


def tool_format(name: str, tokenizer, *, thinking: bool = False) -> ToolFormat:
    """`name`: hermes | dsml | auto (from the tokenizer, `detect_format`)."""
    if name == "auto":
        name = detect_format(tokenizer)
    if name == "hermes":
        return HermesFormat(tokenizer, thinking=thinking)
    if name == "dsml":
        return DsmlFormat(tokenizer, thinking=thinking)
    raise ValueError(f"tool format must be one of {FORMATS}, got {name!r}")
