#include <cstdio>
int main() { std::puts("bagualu"); return 0; }
