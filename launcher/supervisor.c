typedef int gang__placeholder_372;
