// SHA-256 against the FIPS 180-2 test vectors, and the SHA-NI path against the portable one.
#include <random>
#include <string>
#include <vector>

#include "core/sha256.h"
#include "test/catch.h"

namespace {
std::string hex_of(const std::string& s, bool hw) {
  mt::Sha256 h(hw);
  h.update(s.data(), s.size());
  return h.finish_hex();
}
}  // namespace

TEST_CASE("sha256 FIPS 180-2 vectors", "[sha256]") {
  for (bool hw : {false, true}) {
    CAPTURE(hw, mt::sha256_hw_available());
    CHECK(hex_of("", hw) == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    CHECK(hex_of("abc", hw) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    CHECK(hex_of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", hw) ==
          "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    // One million 'a', fed in uneven pieces.
    mt::Sha256 h(hw);
    std::string a(1000, 'a');
    for (int i = 0; i < 1000; ++i) h.update(a.data(), a.size());
    CHECK(h.finish_hex() == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
  }
  CHECK(mt::sha256_hex(std::string("abc")) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

TEST_CASE("sha256 hardware and portable paths agree, streaming equals one-shot", "[sha256]") {
  std::mt19937 rng(7);
  for (size_t len : {1u, 55u, 56u, 63u, 64u, 65u, 119u, 120u, 128u, 1000u, 4099u}) {
    std::string s(len, '\0');
    for (char& c : s) c = static_cast<char>(rng());
    const std::string ref = hex_of(s, false);
    CHECK(hex_of(s, true) == ref);
    mt::Sha256 h;
    size_t pos = 0;
    while (pos < len) {
      size_t n = std::min<size_t>(len - pos, 1 + rng() % 97);
      h.update(s.data() + pos, n);
      pos += n;
    }
    CHECK(h.finish_hex() == ref);
    h.reset();
    h.update(s.data(), s.size());
    CHECK(h.finish_hex() == ref);
  }
}
