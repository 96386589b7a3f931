typedef int gang__placeholder_12038;
