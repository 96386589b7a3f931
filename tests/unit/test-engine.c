/* placeholder until the engine tests land: fails on purpose */
int main(void) { return 1; }
