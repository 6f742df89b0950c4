// megatrain entry point (command line in train/cli.cpp).
int main() { return 0; }
