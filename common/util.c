typedef int gang__placeholder_29919;
