// text/ outside the repository: prints the ids of one line as the Hugging Face folder given as
// its first argument tokenizes it (tokenizer.json), then packs them into one row of 16 with
// text/packing.h. It names cxxlaunch::text, the package's torch-free text target.
//   ./standalone_tokenize_line MODEL_DIR "Hello, world!"

#include <iostream>

#include "text/packing.h"
#include "text/tokenizer.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: standalone_tokenize_line MODEL_DIR TEXT\n";
    return 2;
  }
  const auto tokenizer = cxxlaunch::text::Tokenizer::fromFolder(argv[1]);
  cxxlaunch::text::TrainingExample example;
  example.input_ids = tokenizer.encode(argv[2], /*add_special_tokens=*/false);
  example.labels = example.input_ids;
  for (const int32_t id : example.input_ids) std::cout << id << ' ';
  const auto rows = cxxlaunch::text::packExamples({example}, {.length = 16, .pad_id = 0});
  std::cout << "| " << rows.size() << " row of " << rows.at(0).input_ids.size() << "\n";
  return 0;
}
