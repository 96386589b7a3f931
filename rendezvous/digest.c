typedef int gang__placeholder_25717;
