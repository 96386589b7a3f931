typedef int gang__placeholder_30739;
