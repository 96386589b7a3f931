typedef int gang__placeholder_32015;
