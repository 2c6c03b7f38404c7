// Pre-flight check of a LibTorch archive (the zip that torch::serialize::OutputArchive writes and
// checkpoints are made of), for the damage LibTorch 1.13's loader trusts instead of checking.
//
// LibTorch reads the pickled object tree (data.pkl) with three unchecked assumptions, each of which
// a single damaged byte breaks (found by tests/fuzz/fuzz_checkpoint):
//  - a string's declared length: the unpickler allocates and zero-fills it before noticing the
//    data is shorter (up to 4 GiB from a 4-byte length, an exabyte from an 8-byte one);
//  - a storage's element count: the storage claims count x element size bytes over a record that
//    may be shorter (reads past the buffer);
//  - a tensor's offset, sizes and strides: never compared with its storage (reads past it);
//  - the TorchScript source of the module's class (code/*.py): its parser crashes on some damaged
//    sources, so only the line forms LibTorch writes for a module of attributes are accepted.
// check_torch_archive() walks the zip's central directory and every pickle record with a small
// stack machine (opcodes of pickle protocols 2-5) and rejects these before LibTorch sees the file.
#pragma once

#include <string>

namespace nanogpt::train {

/// Throws std::runtime_error("<what is wrong>") (no tag, no path: the caller adds them) when the
/// archive at `path` is not a zip, or a pickle record declares more bytes than it holds, or a
/// storage or tensor reaches beyond its data, or a code/*.py record is not the plain module source
/// LibTorch writes. Files written by LibTorch always pass.
void check_torch_archive(const std::string& path);

}  // namespace nanogpt::train
