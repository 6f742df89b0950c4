// The megatrain command line (CLI11): subcommands train, config; --version; --help everywhere.
#pragma once

namespace mt {

// Parses argv and runs the subcommand. Returns the process exit code. Throws mt::Error on bad input.
int run_cli(int argc, char** argv);

}  // namespace mt
