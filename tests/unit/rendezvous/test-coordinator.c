/* PLACEHOLDER until written: replaced by the real group. */
int gang_test_coordinator(void);
int gang_test_coordinator(void)
{
    return 0;
}
