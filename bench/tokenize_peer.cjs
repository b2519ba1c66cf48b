// The peer of bench/tokenizer_speed.py: transformers.js's tokenizer (@lenml/tokenizers) over the lines
// of a file, one JSON array of ids per line on stdout (what `tokenize` prints), and on stderr
// the seconds the encoding took, loading excluded.
//   node tokenize_peer.cjs NODE_MODULES MODEL_DIR FILE
const fs = require("fs");
const path = require("path");
const [nodeModules, modelDir, file] = process.argv.slice(2);
const { TokenizerLoader } = require(path.resolve(nodeModules, "@lenml/tokenizers"));
const read = (name) => JSON.parse(fs.readFileSync(path.join(modelDir, name), "utf8"));
const tokenizer = TokenizerLoader.fromPreTrained({
  tokenizerJSON: read("tokenizer.json"),
  tokenizerConfig: read("tokenizer_config.json"),
});
const lines = fs.readFileSync(file, "utf8").split("\n");
if (lines.length > 0 && lines[lines.length - 1] === "") lines.pop();
const start = process.hrtime.bigint();
const out = lines.map((line) => tokenizer.encode(line, { add_special_tokens: false }));
const seconds = Number(process.hrtime.bigint() - start) / 1e9;
process.stdout.write(out.map((ids) => JSON.stringify(ids)).join("\n") + "\n");
process.stderr.write(`${seconds}\n`);
