// make_tokenizer: the --tokenizer flags -> a Tokenizer (see tokenizer.h).
#include "data_tools/tokenizer.h"

#include "core/check.h"
#include "data_tools/gpt2_tokenizer.h"
#include "data_tools/hf_tokenizer.h"

namespace mt::data {

std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerOptions& o) {
  if (o.type == "gpt2-bpe") {
    MT_CHECK(!o.vocab_file.empty() && !o.merge_file.empty(),
             "--tokenizer gpt2-bpe needs --vocab-file encoder.json and --merge-file vocab.bpe "
             "(scripts/fetch_gpt2_tokenizer.sh puts them in data/tokenizers/gpt2/)");
    return std::make_unique<Gpt2Tokenizer>(o.vocab_file, o.merge_file);
  }
  if (o.type == "hf-json") {
    MT_CHECK(!o.tokenizer_file.empty(), "--tokenizer hf-json needs --tokenizer-file tokenizer.json");
    return std::make_unique<HfTokenizer>(o.tokenizer_file, o.eod_token, o.add_special_tokens);
  }
  MT_CHECK(false, "--tokenizer \"", o.type, "\" is not supported; use gpt2-bpe or hf-json");
  return nullptr;
}

void check_tokenizer_flags(const TokenizerOptions& given, const std::string& type_flag) {
  struct Flag {
    bool set;
    const char* name;
    const char* reader;  // the tokenizer that reads it
  };
  const Flag flags[] = {{!given.vocab_file.empty(), "--vocab-file", "gpt2-bpe"},
                        {!given.merge_file.empty(), "--merge-file", "gpt2-bpe"},
                        {!given.tokenizer_file.empty(), "--tokenizer-file", "hf-json"},
                        {!given.eod_token.empty(), "--eod-token", "hf-json"},
                        {!given.add_special_tokens, "--no-add-special-tokens", "hf-json"}};
  for (const Flag& f : flags) {
    if (!f.set || given.type == f.reader) continue;
    MT_CHECK(!given.type.empty(), f.name, " is read by the ", f.reader, " tokenizer but no tokenizer was chosen; add ",
             type_flag, " ", f.reader, " or remove ", f.name);
    MT_CHECK(false, f.name, " is read by the ", f.reader, " tokenizer, not ", given.type, "; remove ", f.name,
             " or use ", type_flag, " ", f.reader);
  }
}

}  // namespace mt::data
