typedef int gang__placeholder_23286;
