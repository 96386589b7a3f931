typedef int gang__placeholder_7056;
