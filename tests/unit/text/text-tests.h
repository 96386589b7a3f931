/* Test groups of the text binary; each returns the number of failed tests. */
#ifndef GANG_TEXT_TESTS_H
#define GANG_TEXT_TESTS_H
int gang_test_tokenizer(void);
int gang_test_chat(void);
int gang_test_jgram(void);
#endif
