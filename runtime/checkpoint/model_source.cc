#include "runtime/checkpoint/model_source.h"

#include "common/error.h"
#include "tensorfile/checkpoint_schema.h"

namespace cxxlaunch::runtime::checkpoint {
namespace {

std::string shapeText(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

}  // namespace

ModelSource::ModelSource(const std::string& dir) : dir_(dir), files_(dir) {}

void ModelSource::read(const std::string& param, const std::string& array, int64_t begin,
                       int64_t end, const std::vector<int64_t>& shape, float* out) const {
  auto it = files_.entries().find(param);
  if (array != tensorfile::kParamArray || it == files_.entries().end()) {
    throw InvalidArgument("'" + dir_ + "' has no tensor '" + param + "'");
  }
  if (it->second.shape != shape) {
    throw InvalidArgument("'" + dir_ + "': '" + param +
                          "' has another shape there than in this model");
  }
  files_.readFloat(param, begin, end, out);
}

bool ModelSource::has(const std::string& param, const std::string& array) const {
  return array == tensorfile::kParamArray && files_.entries().count(param) != 0;
}

torch::Tensor ModelSource::tensor(const std::string& name) const {
  return files_.entries().count(name) != 0 ? files_.tensor(name) : torch::Tensor();
}

std::string ModelSource::mismatch(const torch::nn::Module& model,
                                  std::vector<std::string>* absent_trainable) const {
  std::map<std::string, std::vector<int64_t>> wanted;
  for (const auto& item : model.named_parameters()) {
    if (absent_trainable != nullptr && item.value().requires_grad() &&
        files_.entries().count(item.key()) == 0) {
      absent_trainable->push_back(item.key());
      continue;
    }
    wanted[item.key()] = item.value().sizes().vec();
  }
  for (const auto& item : model.named_buffers()) wanted[item.key()] = item.value().sizes().vec();
  std::vector<std::string> missing, unexpected, reshaped;
  for (const auto& [name, shape] : wanted) {
    auto it = files_.entries().find(name);
    if (it == files_.entries().end()) {
      missing.push_back(name);
    } else if (it->second.shape != shape) {
      reshaped.push_back(name + " " + shapeText(it->second.shape) + " where the model has " +
                         shapeText(shape));
    }
  }
  for (const auto& [name, entry] : files_.entries()) {
    if (wanted.count(name) == 0) unexpected.push_back(name);
  }
  std::string out;
  auto list = [&](const char* what, const std::vector<std::string>& names) {
    if (names.empty()) return;
    out += std::string("\n  ") + what + " (" + std::to_string(names.size()) + "): ";
    for (size_t i = 0; i < names.size() && i < 8; ++i) out += (i ? ", " : "") + names[i];
    if (names.size() > 8) out += ", ...";
  };
  list("missing in the export", missing);
  list("unexpected (not in this model)", unexpected);
  list("of another shape", reshaped);
  return out;
}

}  // namespace cxxlaunch::runtime::checkpoint
