// The executable peer of tests/text/chat_exactness_test.cc: renders a chat template with
// @huggingface/jinja (the JavaScript Jinja made for chat templates, trim_blocks and lstrip_blocks
// on as transformers sets them) over each set of variables of a JSON file, and prints one JSON
// string per set: the rendering, or {"error": message} when the template raised.
//   node js_render.cjs NODE_MODULES CASES_JSON
// CASES_JSON: {"template": "...", "cases": [{"messages": [...], "add_generation_prompt": ..., ...}]}
const fs = require("fs");
const path = require("path");
const [nodeModules, casesPath] = process.argv.slice(2);
const { Template } = require(path.resolve(nodeModules, "@huggingface/jinja"));
const input = JSON.parse(fs.readFileSync(casesPath, "utf8"));
const template = new Template(input.template);
const lines = [];
for (const variables of input.cases) {
  try {
    lines.push(JSON.stringify(template.render(variables)));
  } catch (e) {
    lines.push(JSON.stringify({ error: String(e.message) }));
  }
}
process.stdout.write(lines.join("\n") + "\n");
