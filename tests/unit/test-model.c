/* placeholder until the model-I/O tests land: fails on purpose */
int main(void) { return 1; }
