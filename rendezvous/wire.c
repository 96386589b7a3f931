typedef int gang__placeholder_14523;
