// The Jinja subset of chat templates (text/jinja_*.h) through ChatTemplate, with expected
// renderings worked out by hand from Jinja2's rules, and the Qwen2.5, Llama 3.1 and Mistral
// templates of tests/text/templates/ on conversations whose renderings are written out here.

#include "text/chat_template.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "common/error.h"
#include "support/subprocess.h"

using cxxlaunch::InvalidArgument;
using cxxlaunch::text::ChatTemplate;
using json = nlohmann::ordered_json;

namespace {

// Renders `source` with `vars` as extra variables and no messages.
std::string render(const std::string& source, const json& vars = json::object(),
                   const json& messages = json::array()) {
  return ChatTemplate::fromString(source).render(messages, false, vars);
}

std::string fixture(const std::string& name) {
  std::ifstream in(std::string(TEXT_TEST_DIR) + "/templates/" + name, std::ios::binary);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

json conv(std::initializer_list<std::pair<const char*, const char*>> turns) {
  json out = json::array();
  for (const auto& [role, content] : turns) out.push_back({{"role", role}, {"content", content}});
  return out;
}

}  // namespace

TEST_CASE("Whitespace: trim_blocks, lstrip_blocks and {%- -%} as transformers compiles them",
          "[text][chat]") {
  // The newline after a block tag goes, and the indentation before one on its own line.
  CHECK(render("{% if true %}\n  yes\n    {% endif %}\nend") == "  yes\nend");
  // Not after an expression tag, nor before one.
  CHECK(render("  {{ 'a' }}\n{{ 'b' }}") == "  a\nb");
  CHECK(render("x  {%- if true -%}  \n y \n {%- endif %}") == "xy");
  // A comment is removed, and its newline with it.
  CHECK(render("a\n{# note #}\nb") == "a\nb");
  // One trailing newline of the template is dropped (keep_trailing_newline=False).
  CHECK(render("line\n") == "line");
  CHECK(render("line\n\n") == "line\n");
  // `+` keeps the spaces lstrip_blocks would remove.
  CHECK(render("  {%+ if true %}x{% endif %}") == "  x");
}

TEST_CASE("Values print as Python's str() and tojson as json.dumps(ensure_ascii=False)",
          "[text][chat]") {
  CHECK(render("{{ none }} {{ true }} {{ 1.0 }} {{ 2.5e20 }} {{ 7 // 2 }} {{ -7 // 2 }} "
               "{{ 7 / 2 }} {{ -7 % 3 }} {{ 2 ** 10 }}") ==
        "None True 1.0 2.5e+20 3 -4 3.5 2 1024");
  CHECK(render("{{ 0.1 + 0.2 }} {{ 1e16 }} {{ 1e-5 }} {{ 123456789.0 }} {{ 'a'\n 'b' }}") ==
        "0.30000000000000004 1e+16 1e-05 123456789.0 ab");
  CHECK(render("{{ [1, 'a', none, {'k': \"it's\"}] }}") == "[1, 'a', None, {'k': \"it's\"}]");
  CHECK(render("{{ undefined_name }}|{{ x.y if false }}|") == "||");
  const json data = {{"b", 1}, {"a", {1.5, "é\n\"", nullptr, true}}, {"e", json::object()}};
  CHECK(render("{{ d | tojson }}", {{"d", data}}) ==
        "{\"b\": 1, \"a\": [1.5, \"é\\n\\\"\", null, true], \"e\": {}}");
  CHECK(render("{{ d | tojson(indent=2) }}", {{"d", {{"k", {1, 2}}}}}) ==
        "{\n  \"k\": [\n    1,\n    2\n  ]\n}");
  CHECK(render("{{ 'é😀' | tojson(true) }}{{ {'b': 1, 'a': 2} | tojson(sort_keys=true) }}") ==
        "\"\\u00e9\\ud83d\\ude00\"{\"a\": 2, \"b\": 1}");
  CHECK(render("{{ 'a' ~ 1 ~ none }} {{ 'ab' * 3 }} {{ [1] + [2] }}") == "a1None ababab [1, 2]");
}

TEST_CASE("for: loop variables, else, the if filter and per-iteration scope", "[text][chat]") {
  CHECK(render("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ loop.first }}"
               "{{ loop.last }}{{ loop.length }}{{ loop.revindex }}|{% endfor %}",
               {{"xs", {"a", "b"}}}) == "10TrueFalse22|21FalseTrue21|");
  CHECK(render("{% for x in xs if x > 1 %}{{ x }}{{ loop.index }}{% endfor %}",
               {{"xs", {1, 2, 3}}}) == "2132");
  CHECK(render("{% for x in [] %}no{% else %}empty{% endfor %}") == "empty");
  CHECK(render("{% for x in [1,2,3] %}{% if x == 2 %}{% continue %}{% endif %}{{ x }}"
               "{% if x == 3 %}{% break %}{% endif %}{% endfor %}") == "13");
  CHECK(render("{% for x in [1,2] %}{{ loop.previtem }}-{{ loop.nextitem }};{% endfor %}") ==
        "-2;1-;");
  // A set inside the loop is not seen after it (nor in the next iteration); a namespace is.
  CHECK(
      render("{% set n = 0 %}{% set ns = namespace(t=0) %}{% for x in [1,2,3] %}"
             "{{ n }}{% set n = n + x %}{% set ns.t = ns.t + x %}{% endfor %}{{ n }} {{ ns.t }}") ==
      "0000 6");
  CHECK(render("{% for x in [1,2] %}{% if loop.first %}{% set y = 5 %}{% endif %}{{ y }};"
               "{% endfor %}") == "5;;");
  CHECK(render("{% for k, v in d | items %}{{ k }}={{ v }};{% endfor %}"
               "{% for k in d %}{{ k }}{% endfor %}{% for k, v in d.items() %}{{ v }}{% endfor %}",
               {{"d", {{"b", 1}, {"a", 2}}}}) == "b=1;a=2;ba12");
}

TEST_CASE("Expressions: slices, subscripts, tests, in, conditionals, filters and methods",
          "[text][chat]") {
  const json m = conv({{"system", "S"}, {"user", "U1"}, {"assistant", "A1"}, {"user", "U2"}});
  CHECK(render("{% for x in messages[1:] %}{{ x.content }}{% endfor %}|"
               "{% for x in messages[::-1] %}{{ x['content'] }}{% endfor %}|"
               "{{ messages[-1].content }}{{ messages[1:3] | length }}{{ 'héllo'[1:3] }}"
               "{{ 'abc'[::-1] }}{{ messages[10] is defined }}",
               json::object(), m) == "U1A1U2|U2A1U1S|U22élcbaFalse");
  CHECK(render("{{ 'x' in 'axb' }}{{ 2 in [1,2] }}{{ 'k' in d }}{{ 'z' not in d }}"
               "{{ 1 < 2 < 3 }}{{ 1 == 1.0 }}",
               {{"d", {{"k", 1}}}}) == "TrueTrueTrueTrueTrueTrue");
  CHECK(render("{{ x is none }}{{ x is not none }}{{ y is string }}{{ y is defined }}"
               "{{ z is defined }}{{ d is mapping }}{{ 3 is odd }}{{ 'a' is sameas 'a' }}",
               {{"x", nullptr}, {"y", "s"}, {"d", json::object()}}) ==
        "TrueFalseTrueTrueFalseTrueTrueTrue");
  CHECK(render("{{ 'a' if false else 'b' }}{{ not 0 and 'x' or 'y' }}{{ '' or 'e' }}") == "bxe");
  CHECK(render(
            "{{ '  a b  ' | trim }}|{{ 'hi THERE-you' | title }}|{{ 'ab' | upper }}|"
            "{{ 'AB' | lower }}|{{ 'aBC' | capitalize }}|{{ [1,2,3] | first }}{{ [1,2,3] | last }}|"
            "{{ ['a','b'] | join(', ') }}|{{ u | default('dflt') }}|{{ '' | default('e', true) }}|"
            "{{ 42 | string }}{{ '7' | int + 1 }}|{{ 'aXbX' | replace('X', '-') }}|{{ 'é😀' | "
            "length }}") == "a b|Hi There-You|AB|ab|Abc|13|a, b|dflt|e|428|a-b-|2");
  CHECK(render("{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | "
               "join(',') }}"
               "|{{ messages | rejectattr('role', 'equalto', 'user') | list | length }}"
               "|{{ ['code_interpreter', 'x'] | reject('equalto', 'code_interpreter') | join }}",
               json::object(), m) == "U1,U2|2|x");
  CHECK(render("{{ ' a,b '.strip().split(',') }}{{ 'a  b'.split() }}{{ '\\n\\nx\\n'.lstrip('\\n') "
               "| trim }}{{ '\\n\\t x'.lstrip('\\n') | length }}"
               "{{ 'xab'.rstrip('b') }}{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}"
               "{{ 'a b'.title() }}{{ 'a-b'.replace('-', '+') }}{{ d.get('k') }}{{ d.get('z', 0) }}"
               "{{ d.keys() | list }}{{ d.values() | list }}",
               {{"d", {{"k", 1}}}}) == "['a', 'b']['a', 'b']x3xaTrueTrueA Ba+b10['k'][1]");
}

TEST_CASE("A construct outside the subset is an error naming it and its line", "[text][chat]") {
  auto error = [](const std::string& source, const json& vars = json::object()) {
    try {
      render(source, vars);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CHECK(error("a\n\n{{ x | wordcount }}") ==
        "chat_template line 3: filter 'wordcount' is not supported");
  CHECK(error("{% macro m() %}{% endmacro %}") ==
        "chat_template line 1: statement 'macro' is not supported");
  CHECK(error("\n{{ x is prime }}") == "chat_template line 2: test 'prime' is not supported");
  CHECK(error("{{ 'a'.zfill(3) }}") ==
        "chat_template line 1: method 'zfill' of 'str' is not supported");
  CHECK(error("{{ cycler(1) }}") == "chat_template line 1: function 'cycler' is not supported");
  CHECK(error("{% if x %}") == "chat_template line 1: the template ends before '{% endif %}'");
  CHECK(error("{{ 'a' + 1 }}") ==
        "chat_template line 1: unsupported operand type(s) for +: 'str' and 'int'");
  CHECK(error("\n{{ raise_exception('Roles must alternate') }}") ==
        "chat_template line 2: raise_exception: Roles must alternate");
  CHECK(error("{{ x.y }}") == "chat_template line 1: 'x' is undefined");
  CHECK(error("\n{{ messages[0]['role'] }}") ==
        "chat_template line 2: list object has no element 0");
  CHECK(error("{{ d.a.b }}", {{"d", json::object()}}) ==
        "chat_template line 1: 'dict object' has no attribute 'a'");
  CHECK(error("{{ " + std::string(1000, '(') + "1" + std::string(1000, ')') + " }}") ==
        "chat_template line 1: expressions nested too deeply");
  CHECK(error("{{ " + std::string(1000, '-') + "1 }}") ==
        "chat_template line 1: expressions nested too deeply");
  std::string nested;
  for (int k = 0; k < 1000; ++k) nested += "{% if true %}";
  CHECK_THAT(error(nested),
             Catch::StartsWith("chat_template line 1: ") && Catch::EndsWith("nested too deeply"));
  CHECK(error("{% if x %}{% endfor %}") ==
        "chat_template line 1: unexpected '{% endfor %}': no open block it belongs to");
  // An item or attribute of None is undefined in Jinja2, not an error.
  CHECK(error("{{ n['k'] }}{{ n.k }}{{ n.k is defined }}", {{"n", nullptr}}) == "no error");
  CHECK(error("{% set x.y = 1 %}", {{"x", {{"y", 0}}}}) ==
        "chat_template line 1: cannot assign attribute 'y' of 'x': it is not a namespace()");
}

TEST_CASE("ChatTemplate reads tokenizer_config.json as transformers does", "[text][chat]") {
  // A list of named templates: "default" is used. bos_token as an AddedToken dict.
  const json config = {{"bos_token", {{"content", "<s>"}, {"lstrip", false}}},
                       {"eos_token", "</s>"},
                       {"pad_token", nullptr},
                       {"chat_template",
                        {{{"name", "tool_use"}, {"template", "T"}},
                         {{"name", "default"},
                          {"template",
                           "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}{{ pad_token is "
                           "defined }}{{ tools is none }}"}}}}};
  const auto chat = ChatTemplate::fromConfigJson(config.dump());
  CHECK(chat.render(conv({{"user", "x"}}), false) == "<s>x</s>FalseTrue");
  CHECK_THROWS_WITH(ChatTemplate::fromConfigJson(R"({"eos_token": "</s>"})"),
                    Catch::Contains("has no chat_template"));
  CHECK_THROWS_WITH(
      ChatTemplate::fromConfigJson(R"({"chat_template": [{"name": "rag", "template": ""}]})"),
      Catch::Contains("without a template named 'default'"));
  CHECK_THROWS_WITH(ChatTemplate::fromString("\xff"), "the chat template is not valid UTF-8");
  CHECK_THROWS_WITH(ChatTemplate::fromString("x").render(json::object(), false),
                    Catch::Contains("messages must be a JSON array"));
}

TEST_CASE("Qwen2.5, Llama 3.1 and Mistral templates give the renderings written out by hand",
          "[text][chat]") {
  const auto qwen =
      ChatTemplate::fromString(fixture("qwen2.5.jinja"), {{"eos_token", "<|im_end|>"}});
  CHECK(qwen.render(conv({{"user", "Hi"}}), true) ==
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
        "assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  CHECK(qwen.render(conv({{"system", "S"}, {"user", "Q"}, {"assistant", "A"}}), false) ==
        "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n"
        "<|im_start|>assistant\nA<|im_end|>\n");

  const auto llama = ChatTemplate::fromString(
      fixture("llama3.1.jinja"), {{"bos_token", "<|begin_of_text|>"}, {"eos_token", "<|eot_id|>"}});
  CHECK(llama.render(conv({{"system", " Be brief. "}, {"user", "Hi "}}), true) ==
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n"
        "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"
        "Be brief.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n");

  const auto mistral = ChatTemplate::fromString(fixture("mistral-v0.1.jinja"),
                                                {{"bos_token", "<s>"}, {"eos_token", "</s>"}});
  CHECK(mistral.render(conv({{"user", "Q1"}, {"assistant", "A1"}, {"user", "Q2"}}), false) ==
        "<s>[INST] Q1 [/INST]A1</s> [INST] Q2 [/INST]");
  CHECK_THROWS_WITH(mistral.render(conv({{"assistant", "A"}}), false),
                    Catch::Contains("raise_exception: Conversation roles must alternate"));
  const auto mistral2 = ChatTemplate::fromString(fixture("mistral-v0.2.jinja"),
                                                 {{"bos_token", "<s>"}, {"eos_token", "</s>"}});
  CHECK(mistral2.render(conv({{"system", "S"}, {"user", "Q"}, {"assistant", "A"}}), false) ==
        "<s> [INST] S\n\nQ [/INST] A</s>");
}

TEST_CASE("One ChatTemplate renders from several threads at once", "[text][chat]") {
  const auto chat = ChatTemplate::fromString(fixture("qwen2.5.jinja"));
  const json messages = conv({{"system", "S"}, {"user", "Q"}, {"assistant", "A"}});
  const std::string expected = chat.render(messages, true);
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int k = 0; k < 50; ++k) wrong += chat.render(messages, true) != expected;
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(wrong == 0);
}
