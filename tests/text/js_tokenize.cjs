// The executable peer of tests/text/npm_exactness_test.cc: encodes each string of a JSON corpus
// with transformers.js's tokenizer (@lenml/tokenizers, a no-dependency fork of it) loaded from
// the same tokenizer.json and tokenizer_config.json our Tokenizer reads, and prints one JSON
// array of ids per string, first without and then with special tokens, then one JSON string per
// string: the decoding of its ids without special tokens.
//   node js_tokenize.cjs NODE_MODULES MODEL_DIR CORPUS_JSON
const fs = require("fs");
const path = require("path");
const [nodeModules, modelDir, corpusPath] = process.argv.slice(2);
const { TokenizerLoader } = require(path.resolve(nodeModules, "@lenml/tokenizers"));
const read = (name) => JSON.parse(fs.readFileSync(path.join(modelDir, name), "utf8"));
const tokenizer = TokenizerLoader.fromPreTrained({
  tokenizerJSON: read("tokenizer.json"),
  tokenizerConfig: read("tokenizer_config.json"),
});
const corpus = JSON.parse(fs.readFileSync(corpusPath, "utf8"));
const lines = [];
for (const add of [false, true]) {
  for (const text of corpus) {
    lines.push(JSON.stringify(tokenizer.encode(text, { add_special_tokens: add })));
  }
}
for (const text of corpus) {
  const ids = tokenizer.encode(text, { add_special_tokens: false });
  lines.push(JSON.stringify(ids.length > 0 ? tokenizer.decode(ids) : ""));  // it refuses []
}
process.stdout.write(lines.join("\n") + "\n");
