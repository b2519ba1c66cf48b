// The second peer of tests/text/npm_exactness_test.cc: the tokenizers library itself (Rust,
// through the node binding of @anush008/tokenizers), reading tokenizer.json alone. Prints what
// js_tokenize.cjs prints: one JSON array of ids per string without and then with special tokens,
// then the decoding of each string's ids (special tokens kept).
//   node hf_tokenize.cjs NODE_MODULES MODEL_DIR CORPUS_JSON
const fs = require("fs");
const path = require("path");
const [nodeModules, modelDir, corpusPath] = process.argv.slice(2);
const { Tokenizer } = require(path.resolve(nodeModules, "@anush008/tokenizers"));
const tokenizer = Tokenizer.fromFile(path.join(modelDir, "tokenizer.json"));
const corpus = JSON.parse(fs.readFileSync(corpusPath, "utf8"));
(async () => {
  const lines = [];
  for (const add of [false, true]) {
    for (const text of corpus) {
      const encoding = await tokenizer.encode(text, null, { addSpecialTokens: add });
      lines.push(JSON.stringify(encoding.getIds()));
    }
  }
  for (const text of corpus) {
    const encoding = await tokenizer.encode(text, null, { addSpecialTokens: false });
    lines.push(JSON.stringify(await tokenizer.decode(encoding.getIds(), false)));
  }
  process.stdout.write(lines.join("\n") + "\n");
})();
