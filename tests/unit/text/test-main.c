/* The text module's cmocka binary: the tokenizer's and the chat templates' groups. */
#include "text-tests.h"

int main(void)
{
    int failed = 0;
    failed += gang_test_tokenizer();
    failed += gang_test_chat();
    failed += gang_test_jgram();
    return failed ? 1 : 0;
}
