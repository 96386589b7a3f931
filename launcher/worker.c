typedef int gang__placeholder_13011;
